"""workflows/checks.py called from Python: the results come back as data (and are kept in the store's
checks/), progress goes to the events object, nothing is printed, and bad input is one RequestError
before any environment is built or any check file written."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlbench.workflows import CheckRequest, CheckResults, RequestError, check


class Recorded:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args[0]))


def test_a_check_returns_each_networks_results_and_reports_progress(project, tmp_path, capsys):
    events = Recorded()
    checked = check(CheckRequest(framework=["fake"], network=["transformer_tiny"], env="current",
                                 store=tmp_path / "s"), events)
    assert isinstance(checked, CheckResults)
    assert (checked.device, checked.precision, checked.mode, checked.reference) == ("cpu", "float64", "train", "fake")
    assert [n.network for n in checked.networks] == ["transformer_tiny"]
    assert [r.framework for r in checked.networks[0].results] == ["fake"] and not checked.unsaved
    assert ("network_started", "transformer_tiny") in events.calls and ("network_checked", "transformer_tiny") in events.calls
    assert list((tmp_path / "s" / "checks").rglob("*.json"))  # kept in the store, as the command keeps it
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(("request_", "says"), [
    (CheckRequest(framework=["fake"], precision="bf16"), "unknown precision 'bf16'"),
    (CheckRequest(framework=["fake"], mode="infer"), "unknown mode 'infer'"),
    (CheckRequest(framework=["fake"], device="tpu"), "unknown device 'tpu'"),
    (CheckRequest(framework=["fake"], env="conda"), "unknown environment backend 'conda'"),
    (CheckRequest(framework=["caffe"]), "caffe"),
    (CheckRequest(framework=["fake"], network=["nonet"]), "unknown network 'nonet'"),
    (CheckRequest(framework=["fake"], mode="generate", sequence_length=8), "--sequence-length is for --mode train"),
    (CheckRequest(framework=["fake"], mode="generate", network=["fcn5"]), "--mode generate"),
])
def test_bad_input_is_one_request_error_and_nothing_written(project, tmp_path, request_, says, capsys):
    events = Recorded()
    with pytest.raises(RequestError) as raised:
        check(replace(request_, store=tmp_path / "s"), events)
    assert says in str(raised.value)
    assert events.calls == [] and not (tmp_path / "s" / "checks").exists()
    assert capsys.readouterr() == ("", "")
