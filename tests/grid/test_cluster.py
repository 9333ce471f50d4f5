"""The RULER grid on a two-node Ray cluster on the loopback address: rows equal to the serial run's, a worker killed
mid-grid losing and doubling nothing, `--update` after the driver itself is killed, and nothing listening beyond
127.0.0.1. A random-weight model with SmolLM2's tokenizer keeps each cell to a fraction of a second."""

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codeckv.grid import Local, run_grid
from codeckv.grid.cluster import import_ray
from codeckv.grid.runner import drop_partial_line, read_rows
from codeckv.measure.ruler_job import RulerJob

try:  # first, so this process's Ray and every node it starts take the loopback address (import_ray)
    import_ray(local=True)
except RuntimeError as missing:  # the cluster extra; make test installs it (requirements-cluster.txt)
    pytest.skip(str(missing), allow_module_level=True)
from ray.cluster_utils import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"seconds", "prefill_seconds", "node", "node_kind"}  # what differs between two runs of the same cells
GRID = dict(tiers=["int8", "snapkv-50"], tasks=["niah_single_1", "niah_multikey_1"], lengths=[512], samples=3)
# 6 cells over 2 workers: after a run's first cell, two rounds of cells are left, the time a stop has to land in


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, loaded):
    """A 2-layer random-weight Llama (one KV head of 64) saved with SmolLM2's tokenizer and chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(loaded.tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=loaded.tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node, one CPU each, both on 127.0.0.1 (import_ray's switch, inherited by every node)."""
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * 2**20})
    nodes.add_node(num_cpus=1, object_store_memory=80 * 2**20)
    nodes.wait_for_nodes()
    yield nodes
    nodes.shutdown()


@pytest.fixture(scope="module")
def serial(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "ruler-samples.csv"
    run_grid(RulerJob(tiny_model, **GRID), out, Local(threads=1))
    return _measured(out)


def _measured(path: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_rows(path)]


def _ruler(tiny_model: str, out: Path, address: str, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "codeckv", "ruler", "--model", tiny_model, "--lengths", "512", "--tasks",
               *GRID["tasks"], "--samples", str(GRID["samples"]), "--tiers", *GRID["tiers"], "--threads", "1",
               "--ray", address, "--out", str(out), "--charts", str(out.parent / "charts"), *extra]
    # Ctrl-C as a terminal sends it, whoever started the suite: a shell's background job (`make test &`) ignores
    # SIGINT, and its children would inherit that
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _busy_workers(cluster) -> list[int]:
    """Pids of this cluster's grid workers in the middle of a cell: Ray names a worker's process after what it runs,
    and a worker is a child of its node's raylet (so another cluster on the machine is never touched)."""
    raylets = {info.process.pid for node in [cluster.head_node, *cluster.worker_nodes]
               for info in node.all_processes.get("raylet", [])}
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"ray::GridWorker.run")
                    and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) in raylets):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_nothing_the_cluster_starts_listens_beyond_127_0_0_1(cluster):
    listening = _ray_listeners()
    assert listening, "the cluster's servers were not found"
    assert all(address.is_loopback for address, _ in listening), listening


def _ray_listeners() -> list[tuple[ipaddress.IPv4Address, str]]:
    """(address, process) of every listening TCP socket a Ray process holds (/proc/net/tcp{,6}, state 0A)."""
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                inodes[fields[9]] = _address(fields[1].split(":")[0])
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            sockets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if "ray" not in command:
            continue
        for link in sockets:
            if link.startswith("socket:[") and link[8:-1] in inodes:
                found.append((inodes[link[8:-1]], command.split()[0]))
    return found


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A /proc/net/tcp{,6} address: 32-bit words in hex, each little-endian; an IPv4-mapped IPv6 one as IPv4."""
    raw = b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8))
    address = ipaddress.ip_address(raw)
    return getattr(address, "ipv4_mapped", None) or address


def test_ruler_on_two_nodes_gives_the_serial_rows_though_a_worker_is_killed(cluster, tiny_model, serial, tmp_path):
    out = tmp_path / "ruler.csv"
    driver = _ruler(tiny_model, out, cluster.address)
    killed, deadline = None, time.monotonic() + 120
    while killed is None and driver.poll() is None and time.monotonic() < deadline:
        busy = _busy_workers(cluster)
        if busy:
            os.kill(busy[0], signal.SIGKILL)
            killed = busy[0]
        time.sleep(0.05)
    output = driver.communicate(timeout=300)[0]
    assert driver.returncode == 0, output
    assert killed is not None, "no worker was caught mid-cell"
    samples = out.with_name("ruler-samples.csv")
    assert _measured(samples) == serial, "rows differ from the serial run's (or one was lost or written twice)"
    assert len({row["node"] for row in read_rows(samples)}) == 2, "both nodes served cells"
    assert [row["tier"] for row in read_rows(out)][:3] == ["int8", "snapkv-50", "native"]


def test_a_killed_driver_then_ctrl_c_keep_every_row_and_update_resumes(cluster, tiny_model, serial, tmp_path):
    out = tmp_path / "ruler.csv"
    samples = out.with_name("ruler-samples.csv")

    def stopped_when(ready, stop) -> subprocess.Popen:
        driver = _ruler(tiny_model, out, cluster.address, "--update")
        deadline = time.monotonic() + 120
        while driver.poll() is None and time.monotonic() < deadline:
            if ready():
                stop(driver)
                break
            time.sleep(0.05)
        return driver

    has_a_cell = lambda: samples.exists() and len(read_rows(samples)) >= 3  # noqa: E731 - one cell: 3 tiers' rows
    killed = stopped_when(has_a_cell, lambda driver: driver.kill())  # the driver itself killed after its first cell
    killed.wait(timeout=60)
    drop_partial_line(samples)  # as the resumed run does first: a row the kill cut short is measured again
    kept = _measured(samples)
    assert 3 <= len(kept) < len(serial), "stopped after its first cell and before its last"
    assert len({tuple(row.values()) for row in kept}) == len(kept), "no row written twice"
    gone = time.monotonic() + 60  # Ray ends the killed driver's workers with its job; one still mid-cell would
    while _busy_workers(cluster) and time.monotonic() < gone:  # otherwise trigger the Ctrl-C below before the new
        time.sleep(0.1)  # driver has even imported its modules
    assert not _busy_workers(cluster), "the killed driver's workers outlived it"
    # Ctrl-C once the resumed run is in its grid: a worker of its own caught mid-cell, or (a busy machine can hide
    # them between polls) a cell of its own written, the other worker then on the next
    in_grid = lambda: bool(_busy_workers(cluster)) or len(read_rows(samples)) > len(kept)  # noqa: E731
    interrupted = stopped_when(in_grid, lambda driver: driver.send_signal(signal.SIGINT))
    output = interrupted.communicate(timeout=30)[0]
    assert interrupted.returncode == 130 and "--update resumes" in output, output
    assert _measured(samples)[: len(kept)] == kept, "Ctrl-C kept every row done before it"
    again = _ruler(tiny_model, out, cluster.address, "--update")
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output
    assert _measured(samples) == serial


def test_quality_at_depths_on_two_nodes_gives_the_serial_rows(cluster, tiny_model, tmp_path):
    from codeckv.grid import Ray
    from codeckv.measure.depth_job import DepthJob

    job = DepthJob(tiny_model, ["int8", "snapkv-50"], depths=[48, 96, 144], windows=1)
    run_grid(job, tmp_path / "serial.csv", Local(threads=1))
    run_grid(job, tmp_path / "cluster.csv", Ray(cluster.address, threads=1))
    assert _measured(tmp_path / "cluster.csv") == _measured(tmp_path / "serial.csv")
    depths = [row["prefix_tokens"] for row in read_rows(tmp_path / "cluster.csv")]
    assert depths == ["48"] * 3 + ["96"] * 3 + ["144"] * 3, "native and two tiers a depth, in the grid's order"


def test_quality_over_windows_on_two_nodes_gives_the_serial_rows_and_the_command_resumes_them(cluster, tiny_model,
                                                                                               tmp_path):
    from codeckv.cli import main
    from codeckv.grid import Ray
    from codeckv.measure.quality import as_dicts
    from codeckv.measure.table import write_csv
    from codeckv.measure.window_job import WindowJob
    from codeckv.models import model_tokenizer

    job = WindowJob(tiny_model, ["int8", "snapkv-50"], windows=3, length=96, prefix=48)
    run_grid(job, tmp_path / "serial.csv", Local(threads=1))
    run_grid(job, tmp_path / "cluster.csv", Ray(cluster.address, threads=1))
    assert _measured(tmp_path / "cluster.csv") == _measured(tmp_path / "serial.csv")
    tokenizer = model_tokenizer(tiny_model)
    table = job.combine(read_rows(tmp_path / "serial.csv"), job.reference_windows(tokenizer), tokenizer)
    write_csv(as_dicts(table.rows), tmp_path / "want.csv")
    lines = (tmp_path / "serial.csv").read_text().splitlines()
    windows = tmp_path / "q-windows.csv"
    windows.write_text("\n".join(lines[:8]) + "\n" + lines[8][:40])  # killed while appending window 2's int8 row
    command = ["quality", "--model", tiny_model, "--ray", cluster.address, "--windows", "3", "--length", "96",
               "--prefix", "48", "--tiers", "int8", "snapkv-50", "--out", str(tmp_path / "q.csv"), "--charts",
               str(tmp_path / "charts")]
    assert main([*command, "--update"]) == 0
    assert read_rows(tmp_path / "q.csv") == read_rows(tmp_path / "want.csv"), "window 2's two tiers measured again"
    assert not windows.exists(), "the windows' CSV is a run in progress: gone once its table is written"
