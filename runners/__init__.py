"""dlbench's runners: code that runs inside a framework's own environment (never in the controller's,
but for runners.common.contract, which is standard library only and defines the axes both sides share)."""
