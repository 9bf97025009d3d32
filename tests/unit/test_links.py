"""Shaped links (`--link`) without touching the network: the option's form, tbf's sizes, the subnet
kept off the host's routes, the commands a link is built and removed with (a fake `ip`/`tc` that
records them and keeps the namespaces it was told about), the owner files and the sweep of a
killed run's leftovers, the counters' interpolation, the figures of a record, and the refusals of
the command line. The real thing (root, namespaces, a torch job) is tests/integration/test_links.py."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from dlbench.execution import links
from dlbench.execution.distributed import _wire
from dlbench.execution.jobs import JobOutcome
from dlbench.execution.links import LinkError, LinkSpec, parse_link
from dlbench.execution.placement import local_placement, namespace_placement
from dlbench.execution.wire import WireCounters, ring_allreduce_bytes

# ------------------------------------------------------------------ the option


@pytest.mark.parametrize("text, rate, delay", [
    ("1gbit", 10**9, 0.0), ("10gbit,50us", 10**10, 50e-6), ("100mbit", 10**8, 0.0),
    (" 2.5Gbit , 1ms ", 25 * 10**8, 1e-3), ("500kbit,0.5s", None, None), ("40gbit,1s", 4 * 10**10, 1.0),
])
def test_link_parses_tc_units(text, rate, delay):
    if rate is None:  # 500kbit: under the 1mbit floor
        with pytest.raises(ValueError, match="outside 1mbit..400gbit"):
            parse_link(text)
        return
    spec = parse_link(text)
    assert (spec.rate_bps, spec.delay_s) == (rate, pytest.approx(delay))
    assert spec.asked == "".join(text.split()).lower()


@pytest.mark.parametrize("text, why", [
    ("", "expected RATE"), ("1gbit,1ms,2", "expected RATE"), ("1gbps", "not a number followed by bit"),
    ("fast", "not a number followed by bit"), ("1gbit,50", "not a number followed by us"),
    ("1gbit,0us", r"outside \(0, 1s\]"), ("1gbit,2s", r"outside \(0, 1s\]"), ("1tbit", "outside 1mbit"),
])
def test_bad_links_are_one_error_naming_the_option(text, why):
    with pytest.raises(ValueError, match=why) as e:
        parse_link(text)
    assert str(e.value).startswith("--link ")


def test_tbf_holds_two_ms_in_its_bucket_and_twenty_in_its_queue():
    assert links.tbf_sizes(10**10) == (2_500_000, 25_000_000)  # 1.25 GB/s x 2 ms, x 20 ms
    assert links.tbf_sizes(10**8) == (64 * 1024, 250_000)  # the bucket's floor: a whole offloaded packet
    assert links.tbf_sizes(10**6) == (64 * 1024, 2 * 64 * 1024)  # the queue holds two buckets at least


def test_a_delay_is_netem_under_tbf_on_the_workers_egress():
    plain = links.shaping_commands(parse_link("1gbit"), "ns", "eth")
    assert plain == [["tc", "-n", "ns", "qdisc", "add", "dev", "eth", "root", "handle", "1:", "tbf", "rate",
                      "1000000000bit", "burst", "250000", "limit", "2500000"]]
    delayed = links.shaping_commands(parse_link("1gbit,50us"), "ns", "eth")
    assert delayed[0] == plain[0]
    assert delayed[1] == ["tc", "-n", "ns", "qdisc", "add", "dev", "eth", "parent", "1:1", "handle", "10:", "netem",
                          "delay", "50us"]
    assert "netem delay 50 us" in links.describe_shaping(parse_link("1gbit,50us"))


# ------------------------------------------------------------------ the subnet


def test_the_subnet_stays_off_the_hosts_routes_and_addresses():
    token = "00a0b0"
    first = links.choose_subnet(token, [])
    assert first.prefixlen == 24 and first.subnet_of(ipaddress.ip_network("10.0.0.0/8"))
    assert not first.overlaps(ipaddress.ip_network("10.0.0.0/16"))
    # the host routes exactly that /24, then a /16 around the next: both skipped
    taken = [first, ipaddress.ip_network(f"{first.network_address + 256}/16", strict=False)]
    chosen = links.choose_subnet(token, taken)
    assert not any(chosen.overlaps(t) for t in taken)
    with pytest.raises(LinkError, match="no 10.X.Y.0/24 is free"):
        links.choose_subnet(token, [ipaddress.ip_network("10.0.0.0/8")])


def test_host_networks_reads_routes_and_addresses_but_not_the_default():
    answers = {
        "route": json.dumps([{"dst": "default", "gateway": "192.0.2.1"}, {"dst": "192.0.2.0/24"},
                             {"dst": "172.17.0.1"}, {"dst": "10.1.2.0/24", "dev": "docker9"}]),
        "addr": json.dumps([{"ifname": "eth0", "addr_info": [{"local": "192.0.2.2", "prefixlen": 24}]}]),
    }
    found = links.host_networks(lambda argv: answers[argv[3]])
    assert set(map(str, found)) == {"192.0.2.0/24", "172.17.0.1/32", "10.1.2.0/24"}


# ------------------------------------------------------------------ building and removing, with a fake ip/tc


class FakeIp:
    """Records every command; `ip netns add/del` make and remove a file in `netns_dir` as the real
    one does under /run/netns; `fail_on` makes the first command containing it fail."""

    def __init__(self, netns_dir: Path, fail_on: str | None = None, stderr: str = "boom"):
        self.netns_dir, self.fail_on, self.stderr = netns_dir, fail_on, stderr
        self.commands: list[list[str]] = []
        self.pids: dict[str, list[int]] = {}

    def __call__(self, argv: list[str]) -> str:
        self.commands.append(argv)
        if self.fail_on and self.fail_on in argv:
            self.fail_on = None
            raise LinkError(f"{' '.join(argv)}: {self.stderr}")
        if argv[:3] == ["ip", "netns", "add"]:
            (self.netns_dir / argv[3]).touch()
        elif argv[:3] == ["ip", "netns", "del"]:
            (self.netns_dir / argv[3]).unlink()
        elif argv[:3] == ["ip", "netns", "pids"]:
            return "\n".join(map(str, self.pids.get(argv[3], [])))
        elif argv[:4] == ["ip", "-j", "-4", "route"] or argv[:4] == ["ip", "-j", "-4", "addr"]:
            return "[]"
        return ""


@pytest.fixture
def where(tmp_path):
    netns, owners = tmp_path / "netns", tmp_path / "owners"
    netns.mkdir()
    return netns, owners


def test_a_link_is_built_in_namespaces_only_and_removed_by_name(where):
    netns, owners = where
    fake = FakeIp(netns)
    link = links.create(parse_link("1gbit"), 3, fake, owners, token="abc123")
    assert sorted(os.listdir(netns)) == ["dlbabc123-hub", "dlbabc123-w0", "dlbabc123-w1", "dlbabc123-w2"]
    owner = json.loads((owners / "abc123.json").read_text())
    assert owner["pid"] == os.getpid() and owner["namespaces"] == link.namespaces
    assert owner["create_time"] == pytest.approx(psutil.Process().create_time())
    for argv in fake.commands:  # nothing in the host's namespace: every link command names one of ours
        if argv[0] == "tc" or argv[:2] == ["ip", "-n"]:
            assert argv[2].startswith("dlbabc123-"), argv
        else:
            assert argv[:3] in (["ip", "netns", "add"], ["ip", "-j", "-4"]), argv
    assert not any("iptables" in a or "route" in a and "add" in a for argv in fake.commands for a in argv)
    veth = next(c for c in fake.commands if "veth" in c)
    assert veth == ["ip", "-n", "dlbabc123-hub", "link", "add", "dlbabc123p0", "type", "veth", "peer", "name",
                    "dlbabc123", "netns", "dlbabc123-w0"]
    assert ["ip", "-n", "dlbabc123-w2", "addr", "add", f"{link.address(2)}/24", "dev", "dlbabc123"] in fake.commands
    assert link.address(0) == str(link.subnet.network_address + 1)
    assert sum(c[0] == "tc" for c in fake.commands) == 3  # one tbf per worker's egress
    removed = links.remove("abc123", fake, owners, netns)
    assert removed == sorted(link.namespaces) and not os.listdir(netns) and not (owners / "abc123.json").exists()


def test_a_failed_step_removes_what_was_made(where):
    netns, owners = where
    fake = FakeIp(netns, fail_on="dlbabc123-w1", stderr="RTNETLINK answers: Operation not permitted")
    with pytest.raises(LinkError, match="Operation not permitted"):
        links.create(parse_link("1gbit"), 2, fake, owners, token="abc123", netns_dir=netns)
    assert not os.listdir(netns) and not list(owners.glob("*.json"))


def test_a_kernel_without_netem_refuses_the_delay_by_name(where):
    netns, owners = where
    fake = FakeIp(netns, fail_on="netem", stderr="Error: Specified qdisc kind is unknown.")
    with pytest.raises(LinkError, match=r"no netem qdisc \(CONFIG_NET_SCH_NETEM\).*give a rate only"):
        links.create(parse_link("1gbit,50us"), 2, fake, owners, token="abc123", netns_dir=netns)
    assert not os.listdir(netns)


def test_processes_left_inside_are_killed_before_their_namespace_goes(where):
    netns, owners = where
    fake = FakeIp(netns)
    links.create(parse_link("1gbit"), 2, fake, owners, token="abc123")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fake.pids["dlbabc123-w1"] = [sleeper.pid]
    links.remove("abc123", fake, owners, netns)
    assert sleeper.wait(timeout=10) == -9


def test_the_sweep_removes_a_dead_owners_link_and_leaves_a_live_ones(where, monkeypatch):
    netns, owners = where
    fake = FakeIp(netns)
    monkeypatch.setattr(links.os, "geteuid", lambda: 0)
    mine = links.create(parse_link("1gbit"), 2, fake, owners, token="aaaaaa")
    dead = links.create(parse_link("1gbit"), 2, fake, owners, token="bbbbbb")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    data = json.loads((owners / "bbbbbb.json").read_text())
    (owners / "bbbbbb.json").write_text(json.dumps({**data, "pid": child.pid}))  # its owner was killed
    (netns / "dlbcccccc-w0").touch()  # no owner file at all: made by a run killed before it wrote one
    (netns / "dlbcccccc-unknown").touch()  # not a name dlbench gives: never touched
    (netns / "docker-ns").touch()
    assert links.leftovers(owners, netns) == ["bbbbbb", "cccccc"]
    removed = links.sweep_orphans(fake, owners, netns)
    assert removed == ["dlbbbbbbb-hub", "dlbbbbbbb-w0", "dlbbbbbbb-w1", "dlbcccccc-w0"]
    assert sorted(os.listdir(netns)) == sorted([*mine.namespaces, "dlbcccccc-unknown", "docker-ns"])
    assert [p.stem for p in owners.glob("*.json")] == ["aaaaaa"]
    assert links.sweep_orphans(fake, owners, netns) == []
    assert dead.token not in "".join(os.listdir(netns))


def test_without_root_the_sweep_names_what_it_cannot_remove(where, monkeypatch):
    netns, owners = where
    (netns / "dlbdddddd-hub").touch()
    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    with pytest.raises(LinkError, match="dlbdddddd.*need root"):
        links.sweep_orphans(FakeIp(netns), owners, netns)


def test_without_root_a_link_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    assert "--link needs root" in links.refusal()
    with pytest.raises(LinkError, match="needs root"):
        with links.shaped_link(parse_link("1gbit"), 2):
            pass


# ------------------------------------------------------------------ placement on the link


def test_ranks_on_a_link_start_in_their_namespace_and_share_the_machine():
    p = namespace_placement(["10.9.9.1", "10.9.9.2"], ["dlbx-w0", "dlbx-w1"], 2)
    assert p.command_on(p.hosts[1], ["python", "w.py"], {}, "/r") == ["ip", "netns", "exec", "dlbx-w1", "python", "w.py"]
    assert p.machines() == [("10.9.9.1+10.9.9.2", 2, 2)] and p.threads_per_worker(None) == 1
    assert not p.only_loopback()
    assert p.single_worker() == local_placement(1, 2)  # the baseline has no peer: loopback


# ------------------------------------------------------------------ counters and figures


def test_counters_are_interpolated_at_the_window():
    link = links.Link("abc123", parse_link("1gbit"), 2, ipaddress.ip_network("10.9.9.0/24"))
    c = WireCounters(link)
    c.times = [0, 10, 20, 30]
    c.received = [[0, 0], [100, 10], [300, 10], [300, 40]]
    assert c.sent_between(5, 25) == [250.0, 20.0]  # 300 - 50; 25 - 5
    assert c.sent_between(10, 20) == [200.0, 0.0]
    with pytest.raises(LinkError, match="not sampled over the whole measured window"):
        c.sent_between(5, 31)


def test_counters_read_the_frames_each_worker_sent(tmp_path):
    dev = tmp_path / "dev"
    dev.write_text("Inter-|   Receive |  Transmit\n face |bytes packets ...|bytes\n"
                   "  dlbabc123p0: 1000 5 0 0 0 0 0 0 2000 7 0 0 0 0 0 0\n"
                   "    lo: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n")
    from dlbench.execution.wire import _read_dev
    assert _read_dev(str(dev)) == {"dlbabc123p0": (1000, 2000), "lo": (1, 1)}


def _outcome(sent, iters, status="ok"):
    return JobOutcome(status, None, {0: {"iter_s": [0.1] * iters}}, None, "", 1.0, wire_sent=sent)


def test_bytes_per_iteration_are_per_worker_medians_beside_the_ring_figure():
    wire = _wire([_outcome([100.0, 300.0], 10), _outcome([200.0, 200.0], 10), _outcome([120.0, 260.0], 10),
                  _outcome(None, 0, "failed")], 2, grad_bytes=20)
    assert wire.sent_per_iter == [12.0, 26.0] and wire.mean_per_worker == 19.0
    assert wire.ring_allreduce_bytes == ring_allreduce_bytes(20, 2) == 20.0
    assert wire.iterations == 30
    assert ring_allreduce_bytes(4000, 4) == 6000.0
    assert _wire([JobOutcome("ok", None, {0: {"iter_s": [1]}}, None, "", 1.0, wire_reason="no counters")], 2, 8) \
        == "no counters"
    assert _wire([_outcome(None, 0, "failed")], 2, 8) is None


# ------------------------------------------------------------------ the command line


def invoke(*args: str):
    from typer.testing import CliRunner

    from dlbench.cli import app

    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, " ".join(re.sub(r"\x1b\[[0-9;]*m", "", result.stderr).split())


@pytest.mark.parametrize("args, message", [
    (["--suite", "fcn", "--link", "1gbit"], "--link is not taken by suite 'fcn' of kind benchmark"),
    # convergence suites take --link since their tasks train data-parallel (issue 44): not on one worker
    (["--suite", "convergence", "--link", "1gbit"], "a convergence task on one worker exchanges no gradients"),
    (["--suite", "distributed", "--link", "1gbps"], "--link '1gbps': rate '1gbps' is not a number"),
    (["--suite", "comm", "--link", "1gbit", "--workers", "1"], "a link joins two workers at least"),
    (["--suite", "distributed", "--link", "1gbit", "--hosts", "127.0.0.2,127.0.0.3"], "does not reach --hosts"),
    (["--suite", "distributed", "--link", "1gbit", "--device", "cuda"], "--link runs CPU jobs only"),
])
def test_the_command_line_refuses_before_anything_runs(tmp_path, args, message):
    code, err = invoke("run", *args, "--framework", "torch", "--profile", "smoke", "--store", str(tmp_path / "s"))
    assert code == 2, err
    assert message in err
    assert not (tmp_path / "s").exists()


def _config(tmp_path, *lines: str):
    import gzip

    path = tmp_path / "config.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_netem_is_known_missing_only_from_the_kernels_own_configuration(tmp_path):
    none = tmp_path / "sys"
    none.mkdir()
    assert links.netem_missing(_config(tmp_path, "# CONFIG_NET_SCH_NETEM is not set", "# CONFIG_MODULES is not set"), none)
    assert links.netem_missing(_config(tmp_path, "CONFIG_NET_SCH_NETEM=m", "# CONFIG_MODULES is not set"), none)
    assert not links.netem_missing(_config(tmp_path, "CONFIG_NET_SCH_NETEM=y"), none)
    assert not links.netem_missing(_config(tmp_path, "CONFIG_NET_SCH_NETEM=m", "CONFIG_MODULES=y"), none)
    assert not links.netem_missing(tmp_path / "absent.gz", none)  # cannot tell: making the link will say
    (none / "sch_netem").mkdir()
    assert not links.netem_missing(_config(tmp_path, "# CONFIG_NET_SCH_NETEM is not set"), none)


def test_a_delay_without_netem_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(links, "netem_missing", lambda: True)
    code, err = invoke("run", "--suite", "distributed", "--link", "1gbit,50us", "--framework", "torch", "--profile",
                       "smoke", "--store", str(tmp_path / "s"))
    assert code == 2 and "--link 1gbit,50us: this kernel has no netem qdisc" in err and "give a rate only" in err
    assert not (tmp_path / "s").exists()
