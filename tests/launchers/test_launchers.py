"""The launchers print the exact command under DRY_RUN=1 and refuse bad roles."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_single_node_dry_run_prints_the_entrypoint_command() -> None:
    out = _run(
        "run_experiment_single_node.sh", "diffusion/sd3_trainside", "num_devices=8", DRY_RUN="1"
    )
    assert out.returncode == 0, out.stderr
    assert (
        "python -m unirl.train_diffusion --config-name=diffusion/sd3_trainside num_devices=8"
        in out.stdout
    )
    out = _run("run_experiment_single_node.sh", "vlm/x", DRY_RUN="1", ENTRY="train_vlm")
    assert "python -m unirl.train_vlm --config-name=vlm/x" in out.stdout


def test_multinode_head_waits_for_the_cluster_before_running() -> None:
    out = _run(
        "run_experiment_multinode.sh",
        "diffusion/sd3_trainside",
        "num_devices=16",
        DRY_RUN="1",
        ROLE="head",
        NNODES="2",
        GPUS_PER_NODE="8",
        NODE_IP="10.1.2.3",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(
        "ray start --head --node-ip-address=10.1.2.3 --port=6379 --num-gpus=8"
    )
    assert "wait_for_cluster.py --nodes 2 --gpus 16" in lines[1]
    assert lines[2].startswith(
        "python -m unirl.train_diffusion --config-name=diffusion/sd3_trainside num_devices=16"
    )
    worker = _run(
        "run_experiment_multinode.sh",
        DRY_RUN="1",
        ROLE="worker",
        HEAD_ADDR="10.1.2.3",
        GPUS_PER_NODE="8",
    )
    assert worker.stdout.strip() == "ray start --address=10.1.2.3:6379 --num-gpus=8 --block"


def test_report_to_wandb_is_refused_naming_the_override() -> None:
    """No launcher can add W&B without replacing the recipe's tracker list, so the variable
    is refused with the override to use instead of being ignored; workers run no recipe."""
    head = {"ROLE": "head", "NODE_IP": "10.1.2.3"}
    for script, env in (
        ("run_experiment_single_node.sh", {}),
        ("run_experiment_multinode.sh", head),
    ):
        out = _run(script, "diffusion/sd3_trainside", DRY_RUN="1", REPORT_TO_WANDB="1", **env)
        assert out.returncode == 2 and out.stdout == "", script
        assert "REPORT_TO_WANDB is not read: add logging.trackers=[local,wandb]" in out.stderr
        off = _run(script, "diffusion/sd3_trainside", DRY_RUN="1", REPORT_TO_WANDB="0", **env)
        assert off.returncode == 0 and "wandb" not in off.stdout, off.stderr
    worker = _run(
        "run_experiment_multinode.sh",
        DRY_RUN="1",
        ROLE="worker",
        HEAD_ADDR="10.1.2.3",
        REPORT_TO_WANDB="1",
    )
    assert worker.returncode == 0 and worker.stdout.startswith("ray start --address=10.1.2.3")


def test_multinode_rejects_a_bad_role_and_a_worker_without_head() -> None:
    assert _run("run_experiment_multinode.sh", ROLE="chief").returncode == 2
    out = _run("run_experiment_multinode.sh", ROLE="worker", DRY_RUN="1", HEAD_ADDR="")
    assert out.returncode != 0 and "HEAD_ADDR" in out.stderr


def test_wait_for_cluster_times_out_with_what_is_missing(tmp_path: Path) -> None:
    """Against a real one-node Ray cluster (its own head, on this machine's own address as Ray
    binds by default — a driver joining a 127.0.0.1-only head hangs in Ray 2.60 — stopped by
    killing its process group, so other Ray runtimes here are untouched) asking for a second
    node: exits 1 and says what is missing; asking for one node: ready."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's unix sockets live there
    head = subprocess.Popen(
        [
            "ray",
            "start",
            "--head",
            "--block",
            "--port=6391",
            "--num-cpus=1",
            "--disable-usage-stats",
            "--include-dashboard=false",
            "--temp-dir",
            temp_dir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        from ray._private.services import get_node_ip_address

        wait = {**env, "RAY_ADDRESS": f"{get_node_ip_address()}:6391"}
        ready = subprocess.run(
            [
                sys.executable,
                str(EXAMPLES / "wait_for_cluster.py"),
                "--nodes",
                "1",
                "--timeout",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=wait,
        )
        assert ready.returncode == 0 and "ready: 1 nodes" in ready.stdout, ready.stderr[-2000:]
        out = subprocess.run(
            [
                sys.executable,
                str(EXAMPLES / "wait_for_cluster.py"),
                "--nodes",
                "2",
                "--timeout",
                "3",
                "--poll",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=wait,
        )
        assert out.returncode == 1
        assert "have 1 nodes" in out.stderr and "want 2" in out.stderr
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_multinode_head_runs_the_trainer_in_its_own_process(tmp_path: Path) -> None:
    """The head's last step replaces the shell (exec): a SIGTERM sent to the launcher's pid (a
    container's PID 1, a scheduler) reaches the trainer, which stops with a checkpoint.
    ``ray`` and ``python`` are faked on PATH; the fake trainer reports its pid."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("ray", "exit 0"),
        ("python", '[[ "$1" == *wait_for_cluster.py ]] && exit 0\necho "trainer pid $$: $*"'),
    ):
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "ROLE": "head",
        "NODE_IP": "127.0.0.1",
        "GPUS_PER_NODE": "0",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    proc = subprocess.Popen(
        ["bash", str(EXAMPLES / "run_experiment_multinode.sh"), "diffusion/x", "seed=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == (
        f"trainer pid {proc.pid}: -m unirl.train_diffusion --config-name=diffusion/x seed=1"
    )


def test_slurm_wrapper_makes_the_first_node_the_head_and_the_rest_workers(tmp_path: Path) -> None:
    """Under DRY_RUN the sbatch script prints one srun per node: the head with the node count
    and the recipe, each worker pointed at the head; `scontrol` is faked on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(
        '#!/usr/bin/env bash\n[[ "$1 $2" == "show hostnames" ]] && printf "gpu-a\\ngpu-b\\ngpu-c\\n"\n'
    )
    fake.chmod(0o755)
    env = {
        "DRY_RUN": "1",
        "SLURM_JOB_NODELIST": "gpu-[a-c]",
        "SLURM_GPUS_ON_NODE": "h100:8",
        "UNIRL_ROOT": str(EXAMPLES.parent),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    out = _run("../deploy/slurm/unirl.sbatch", "diffusion/sd3_trainside", "num_devices=24", **env)
    assert out.returncode == 0, out.stderr
    lines = [x.rstrip() for x in out.stdout.splitlines()]
    launcher = str(EXAMPLES / "run_experiment_multinode.sh")
    head = [line for line in lines if "ROLE=head" in line]
    workers = [line for line in lines if "ROLE=worker" in line]
    assert len(head) == 1 and len(workers) == 2 and lines[0] == head[0]  # head first
    assert head[0].startswith("srun --nodes=1 --ntasks=1 -w gpu-a env ROLE=head NODE_IP=gpu-a")
    assert "NNODES=3 ENTRY=train_diffusion" in head[0] and "GPUS_PER_NODE=8" in head[0]
    assert head[0].endswith(f"bash {launcher} diffusion/sd3_trainside num_devices=24")
    assert {w.split(" -w ")[1].split()[0] for w in workers} == {"gpu-b", "gpu-c"}
    assert all("HEAD_ADDR=gpu-a" in w and w.endswith(f"bash {launcher}") for w in workers)
    missing = _run(
        "../deploy/slurm/unirl.sbatch",
        "diffusion/sd3_trainside",
        **{**env, "SLURM_JOB_NODELIST": ""},
    )
    assert missing.returncode == 2 and "submit with sbatch" in missing.stderr


def test_kuberay_example_entrypoint_composes() -> None:
    """The RayJob's entrypoint is a recipe command that passes dry_run as written."""
    import shlex

    import yaml

    spec = yaml.safe_load((EXAMPLES.parent / "deploy" / "kuberay" / "rayjob.yaml").read_text())
    assert spec["kind"] == "RayJob"
    argv = shlex.split(spec["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "unirl.train_diffusion"]
    out = subprocess.run(
        [sys.executable, *argv[1:], "dry_run=true"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        cwd=EXAMPLES.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "devices: 16 x cuda" in out.stdout


def test_entry_train_pe_in_both_launchers() -> None:
    """``ENTRY=train_pe`` runs the prompt-enhancer entrypoint from either launcher (DRY_RUN
    prints the command); an ENTRY with no entrypoint module is refused before Ray starts."""
    out = _run(
        "run_experiment_single_node.sh",
        "pe/pe_tiny_trainside",
        "num_rollouts=5",
        DRY_RUN="1",
        ENTRY="train_pe",
    )
    assert out.returncode == 0, out.stderr
    assert (
        "python -m unirl.train_pe --config-name=pe/pe_tiny_trainside num_rollouts=5" in out.stdout
    )
    head = _run(
        "run_experiment_multinode.sh",
        "pe/pe_trainside_pickscore",
        "num_devices=16",
        DRY_RUN="1",
        ENTRY="train_pe",
        ROLE="head",
        NNODES="2",
        GPUS_PER_NODE="8",
        NODE_IP="10.1.2.3",
    )
    assert head.returncode == 0, head.stderr
    lines = head.stdout.strip().splitlines()
    assert lines[2].startswith(
        "python -m unirl.train_pe --config-name=pe/pe_trainside_pickscore num_devices=16"
    )
    for script, env in (
        ("run_experiment_single_node.sh", {}),
        ("run_experiment_multinode.sh", {"ROLE": "head", "NODE_IP": "10.1.2.3"}),
    ):
        bad = _run(script, "pe/pe_tiny_trainside", DRY_RUN="1", ENTRY="train-pe", **env)
        assert bad.returncode == 2 and bad.stdout == "", script
        assert "ENTRY=train-pe: there is no entrypoint unirl/train-pe.py" in bad.stderr
        assert "train_pe" in bad.stderr.split("choose one of:")[1]


def test_single_node_launcher_runs_train_pe(tmp_path: Path) -> None:
    """Not a DRY_RUN: the launcher execs ``python -m unirl.train_pe`` on the tiny recipe with
    the recipe's own ``dry_run=true`` (validated, no Ray)."""
    out = subprocess.run(
        [
            "bash",
            str(EXAMPLES / "run_experiment_single_node.sh"),
            "pe/pe_tiny_trainside",
            "dry_run=true",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=EXAMPLES.parent,
        env={**os.environ, "ENTRY": "train_pe"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "drawer (pe.diffusion):" in out.stdout and "no Ray started" in out.stdout


def test_entry_train_unified_model_in_both_launchers(tmp_path: Path) -> None:
    """``ENTRY=train_unified_model`` from either launcher: DRY_RUN prints the command; the
    single-node launcher execs it on the tiny recipe with the recipe's ``dry_run=true``."""
    out = _run(
        "run_experiment_single_node.sh",
        "unified_model/unified_tiny",
        "num_rollouts=5",
        DRY_RUN="1",
        ENTRY="train_unified_model",
    )
    assert out.returncode == 0, out.stderr
    assert (
        "python -m unirl.train_unified_model --config-name=unified_model/unified_tiny "
        "num_rollouts=5" in out.stdout
    )
    head = _run(
        "run_experiment_multinode.sh",
        "unified_model/hi3_vllmomni",
        "num_devices=16",
        DRY_RUN="1",
        ENTRY="train_unified_model",
        ROLE="head",
        NNODES="2",
        GPUS_PER_NODE="8",
        NODE_IP="10.1.2.3",
    )
    assert head.returncode == 0, head.stderr
    assert (
        head.stdout.strip()
        .splitlines()[2]
        .startswith("python -m unirl.train_unified_model --config-name=unified_model/hi3_vllmomni")
    )
    ran = subprocess.run(
        [
            "bash",
            str(EXAMPLES / "run_experiment_single_node.sh"),
            "unified_model/unified_tiny",
            "dry_run=true",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=EXAMPLES.parent,
        env={**os.environ, "ENTRY": "train_unified_model"},
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "image stage (unified.image)" in ran.stdout and "no Ray started" in ran.stdout


def test_kuberay_image_is_built_by_the_dockerfile_with_the_pinned_ray() -> None:
    """The image the RayJob names is the tag deploy/Dockerfile's build line makes; its base
    image's Ray is the RayJob's rayVersion and constraints.txt's pin; it installs the way
    .ci/run (the README's install) does."""
    import re

    import yaml

    root = EXAMPLES.parent
    spec = yaml.safe_load((root / "deploy" / "kuberay" / "rayjob.yaml").read_text())
    cluster = spec["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    images = {c["image"] for g in groups for c in g["template"]["spec"]["containers"]}
    dockerfile = (root / "deploy" / "Dockerfile").read_text()
    built = re.search(r"docker build -f deploy/Dockerfile -t (\S+) \.", dockerfile)
    assert built is not None and images == {built.group(1)}
    base = re.search(r"^FROM rayproject/ray:([\d.]+)-py(\d)(\d+)-gpu$", dockerfile, re.MULTILINE)
    pinned = re.search(r"^ray==([\d.]+)$", (root / "constraints.txt").read_text(), re.MULTILINE)
    assert base is not None and pinned is not None
    assert base.group(1) == cluster["rayVersion"] == pinned.group(1)
    ci_installs = [
        line.split("#")[0].strip()
        for line in (root / ".ci" / "run").read_text().splitlines()
        if line.startswith("pip install")
    ]
    for command in ci_installs:  # the same commands, without pip's cache
        words = command.split()
        expected = " ".join([*words[:2], "--no-cache-dir", *words[2:]])
        if "'.[dev]'" in command:  # the image installs the package without the dev extra
            expected = expected.replace("-e '.[dev]'", "-e .")
        assert expected in dockerfile, expected
