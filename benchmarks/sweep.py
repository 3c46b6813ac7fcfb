"""Design sweeps: ``ladmac sweep lad --set NAME=V1,V2,... [--hardware]``.

Every point of the grid (the product of the ``--set`` value lists) is one independent
``ladmac eval lad`` run inside SmolLM2 (teacher-forced WikiText-2, no generation), executed as
a Ray task: local by default (one CPU per point, ``--workers`` at a time), on a Ray cluster with
``--address`` (one started with ``ray start --head`` is reached as it is, token authentication
included: :func:`connect`). Each point's JSON is kept under ``OUT/points/`` keyed by its
arguments, so an interrupted sweep resumes where it stopped (``--fresh`` recomputes). The sweep writes
``OUT/sweep.json``, a Markdown table ``OUT/sweep.md`` and a Pareto plot ``OUT/pareto.png``:
perplexity change vs keys + values read (% of dense) and, with ``--hardware``, vs the tile's cycles
(% of the dense baseline's over the last 512 steps, ``golden.lad_tile.schedule_cycles``) and vs the
whole model's energy per token (``ladmac system``'s model of SmolLM2 on DDR4-3200 with the tiles'
state streamed, fed by the point's activity record), coloured by the tile's SRAM (with
``--hardware``: the bit-accurate LAD tile, whose SRAM banks are sized by
``hdl.lad.common.sram_banks``; without: the float reference ``LadConfig``).
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from golden.cli import AtLeast, Parser
from golden.errors import ConfigError

POINT_FORMAT = 2   # bump when a point's JSON changes meaning (2: the tile's cycles, eas_beats default 1)
ENERGY_DRAM, ENERGY_RESIDENCY = "ddr4-3200", "streamed"   # the system model's setting for the energy column


def grid(pairs: list[str]) -> list[dict[str, str]]:
    """``["a=1,2", "b=x"]`` -> ``[{"a": "1", "b": "x"}, {"a": "2", "b": "x"}]``."""
    axes = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects NAME=V1,V2,..., got '{pair}'")
        name, values = (s.strip() for s in pair.split("=", 1))
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not name or not vals:
            raise ConfigError(f"--set expects NAME=V1,V2,..., got '{pair}'")
        if name in axes:
            raise ConfigError(f"--set {name} given twice")
        axes[name] = vals
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())] or [{}]


def point_config(point: dict[str, str], hardware: bool):
    """The config a point evaluates (validated here, before any run starts)."""
    from golden.lad_ref import LadConfig
    from golden.lad_tile import LadTileConfig
    base = LadTileConfig() if hardware else LadConfig()
    return base.with_overrides(point)


def activity_path(out: str | Path) -> Path:
    """Where a hardware point's activity record (``eval --activity``) sits next to its JSON."""
    return Path(str(out).removesuffix(".json") + ".activity.json")


def point_command(point: dict[str, str], args, out: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "ladmac_cli", "eval", "lad", "--tokens", str(args.tokens), "--context",
           str(args.context), "--prompts", "0", "--no-progress", "--threads", "1"]
    cmd += ["--hardware", "--variants", "lad-tile"] if args.hardware else ["--variants", "lad"]
    if args.hardware and out:
        cmd += ["--activity", str(activity_path(out))]
    for k, v in point.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def point_key(point: dict[str, str], args) -> str:
    text = json.dumps({"format": POINT_FORMAT, "point": point, "hardware": args.hardware, "tokens": args.tokens,
                       "context": args.context}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def run_point(cmd: list[str], out: str, cwd: str) -> dict:
    """One point: the eval command writing ``out``; returns what it wrote, or its error."""
    t0 = time.time()
    tmp = out + ".tmp"
    done = subprocess.run(cmd + ["--out", tmp], capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        return {"error": f"exit {done.returncode}: {tail}", "seconds": time.time() - t0}
    Path(tmp).replace(out)
    return json.loads(Path(out).read_text())


TOKEN_HINT = ("set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file) to the cluster's token, which "
              "`ray get-auth-token` prints on its head node")


@contextlib.contextmanager
def _fd2_into(held):
    """Send file descriptor 2 into the open file ``held`` for the block: Ray's C++ core writes its
    connection warnings (one per retry) there, below Python's ``sys.stderr``."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(held.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _answers(address: str) -> None:
    """ConfigError unless something accepts a TCP connection at a ``[ray://]HOST:PORT`` address
    (other forms, e.g. ``auto``, are left to Ray): ``ray.init`` retries a dead address for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as err:
        raise ConfigError(f"--address {address}: nothing answers there ({err.strerror or err}); start a Ray head "
                          f"with `ray start --head --port {port}`") from None


def connect(address: str | None, workers: int) -> None:
    """``ray.init`` for the sweep: a new local Ray instance running ``workers`` points at once (not a
    cluster that ``ray start`` left running, which a plain ``ray.init()`` would join and then refuse
    ``num_cpus``), or the cluster at ``address``.

    Token authentication (Ray's, as in the installed 2.60): ``ray start --head`` turns it on when a
    token exists on the machine (``~/.ray/auth_token``, which every local ``ray.init()`` writes, or
    ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``), but ``ray.init(address=...)`` does so only for
    ``auto``; with an explicit address it retries for 20 s on InvalidAuthToken and fails. So the
    client makes ``ray start``'s choice with Ray's own function (``RAY_AUTH_MODE`` unset and a token
    found: token mode; an explicit ``RAY_AUTH_MODE`` wins; a cluster without authentication ignores
    the token). Ray's warnings while connecting are held back; a failed connection is one
    ConfigError line saying what to set."""
    import ray
    if address is None:   # "local": a new instance even when `ray start` or RAY_ADDRESS names a cluster
        ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        return
    _answers(address)
    with tempfile.TemporaryFile() as held:
        try:
            with _fd2_into(held):
                try:
                    from ray._private.authentication.authentication_token_setup import (
                        maybe_enable_token_auth_if_token_available)
                except ImportError:   # a Ray without token authentication: nothing to choose
                    pass
                else:
                    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except Exception as err:   # whatever ray.init raised, the address given did not work
            held.seek(0)
            said = held.read().decode(errors="replace")
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            if "no authentication token was found" in first:
                raise ConfigError(f"--address {address}: RAY_AUTH_MODE is token but no Ray authentication token "
                                  f"was found; {TOKEN_HINT}") from None
            if "InvalidAuthToken" in said or "Unauthenticated" in said:
                mode = os.environ.get("RAY_AUTH_MODE", "")
                why = ("refused this client's authentication token (not the cluster's)" if mode.lower() == "token"
                       else f"wants an authentication token, which RAY_AUTH_MODE={mode} does not send (unset it)"
                       if mode else "wants an authentication token and none was found here")
                raise ConfigError(f"--address {address}: the Ray cluster there {why}; {TOKEN_HINT}") from None
            raise ConfigError(f"--address {address}: no Ray cluster reached ({first}); start one with "
                              f"`ray start --head --port PORT`") from None


def energy_uj(activity: Path) -> float:
    """SmolLM2's energy per decode token (uJ) with the point's LAD tile: the system model
    (synth/system) on ENERGY_DRAM, state ENERGY_RESIDENCY, at the record's last context."""
    from golden.llm.activity import read_activity
    from synth.system.engines import lad_engine
    from synth.system.model import decode_step
    from synth.system.shapes import SHAPES
    from synth.system.tech import Tech
    rec = read_activity(activity)
    shape, tech = SHAPES["smollm2"], Tech()
    eng = lad_engine(shape, rec["windows"][-1]["last_context"], rec)
    return 1e6 * decode_step(eng, shape, tech, tech.dram(ENERGY_DRAM), None, ENERGY_RESIDENCY).joules


def summarize(point: dict[str, str], result: dict, hardware: bool, out: str | Path | None = None) -> dict:
    """One table row: perplexity and its change, keys/values read, SRAM of the point's tile and,
    with its activity record, the whole model's energy per token."""
    row = {"point": point}
    if "error" in result:
        return {**row, "error": result["error"]}
    variant = "lad-tile" if hardware else "lad"
    st = result["teacher_forced_stats"][variant]
    row.update(perplexity=result["perplexity"][variant], full=result["perplexity"]["full"],
               delta_pct=result["perplexity_delta_pct"][variant], keys_read_pct=st["keys_read_pct"],
               values_read_pct=st["values_read_pct"], kv_read_pct=(st["keys_read_pct"] + st["values_read_pct"]) / 2,
               centers_mean=st["centers_per_head_mean"], seconds=result.get("seconds"),
               kv_read_last_pct=(st.get("keys_read_last512_pct", float("nan")) +
                                 st.get("values_read_last512_pct", float("nan"))) / 2,
               cycles_last_pct=st.get("cycles_last512_pct", float("nan")))
    if hardware:
        from hdl.lad.common import sram_bits_per_head
        cfg = point_config(point, True)
        row["sram_kib"] = sram_bits_per_head(cfg) / 8192   # per query head
        found = out is not None and activity_path(out).is_file()   # points run before records were kept lack it
        row["energy_uj"] = energy_uj(activity_path(out)) if found else float("nan")
    return row


def pareto(rows: list[dict], keys: tuple[str, ...]) -> list[bool]:
    """For each row: no other row is at least as good on every key (smaller is better) and better on one."""
    ok = [r for r in rows if "error" not in r]

    def dominated(r):
        return any(all(o[k] <= r[k] for k in keys) and any(o[k] < r[k] for k in keys) for o in ok if o is not r)
    return ["error" not in r and not dominated(r) for r in rows]


def last_pct(row: dict, key: str) -> str:
    """A last-512-steps figure; "n/a" for a point cached before the eval reported it."""
    value = row.get(key, float("nan"))
    return "n/a" if value != value else f"{value:.1f}%"


def write_table(rows: list[dict], front: list[bool], path: Path, hardware: bool) -> None:
    names = sorted({k for r in rows for k in r["point"]})
    head = names + ["perplexity", "vs full", "keys read", "values read", "K+V read, last 512 steps", "centers/head"] + \
        (["cycles vs dense, last 512 steps", "SRAM KiB per query head",
          f"energy/token uJ (SmolLM2, {ENERGY_DRAM}, {ENERGY_RESIDENCY})"] if hardware else []) + ["Pareto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, f in zip(rows, front):
        cells = [r["point"].get(n, "") for n in names]
        if "error" in r:
            cells += [r["error"]] + [""] * (len(head) - len(names) - 2) + [""]
        else:
            cells += [f"{r['perplexity']:.3f}", f"{r['delta_pct']:+.2f}%", f"{r['keys_read_pct']:.1f}%",
                      f"{r['values_read_pct']:.1f}%", last_pct(r, "kv_read_last_pct"),
                      f"{r['centers_mean']:.0f}"]
            energy = r.get("energy_uj", float("nan"))
            cells += [last_pct(r, "cycles_last_pct"), f"{r['sram_kib']:.0f}",
                      "n/a" if energy != energy else f"{energy:.0f}"] if hardware else []
            cells += ["yes" if f else ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def plot(rows: list[dict], front: list[bool], path: Path, hardware: bool, title: str) -> None:
    """Perplexity change (symmetric log scale: +-1 % and +1000 % both readable) vs keys + values
    read and, for the tile, vs its cycles (% of the dense baseline's, last 512 steps); colour: SRAM
    (or centers). Points with the same result share one marker and one label listing them; Pareto
    points are ringed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [(r, f) for r, f in zip(rows, front) if "error" not in r]
    xkeys = [("kv_read_pct", "keys + values read (% of dense, mean of the two)")]
    if hardware and any(r.get("cycles_last_pct", float("nan")) == r.get("cycles_last_pct") for r, _ in ok):
        xkeys.append(("cycles_last_pct", "tile cycles (% of the dense baseline's, last 512 steps)"))
    fig, axes = plt.subplots(1, len(xkeys), figsize=(8 * len(xkeys), 5), squeeze=False)
    colour = (lambda r: r["sram_kib"]) if hardware else (lambda r: r["centers_mean"])
    for ax, (xkey, xlabel) in zip(axes[0], xkeys):
        groups: dict[tuple, list] = {}
        for r, f in ok:
            if r.get(xkey, float("nan")) == r.get(xkey):   # not NaN
                groups.setdefault((round(r[xkey], 3), round(r["delta_pct"], 3)), []).append((r, f))
        xs, ys, cs = [], [], []
        for (x, y), members in groups.items():
            xs.append(x)
            ys.append(y)
            cs.append(min(colour(r) for r, _ in members))
            if any(f for _, f in members):
                ax.scatter([x], [y], s=160, facecolors="none", edgecolors="red", zorder=4)
            label = "\n".join(",".join(f"{k}={v}" for k, v in r["point"].items()) for r, _ in members)
            ax.annotate(label, (x, y), fontsize=6, xytext=(5, -3), textcoords="offset points", va="top")
        sc = ax.scatter(xs, ys, c=cs, cmap="viridis", s=45, zorder=3)
        fig.colorbar(sc, ax=ax, label="SRAM per query head (KiB; smallest of the points at a marker)" if hardware
                     else "centers per head (mean)")
        ax.set_yscale("symlog", linthresh=2.0)
        ax.margins(x=0.2)
        for level in (-1.0, 1.0):
            ax.axhline(level, color="grey", ls="--", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("perplexity vs full attention (%, symlog)")
        ax.set_title(title + " (red ring: Pareto)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _parser() -> Parser:
    p = Parser(prog="ladmac sweep lad", description=__doc__.splitlines()[0])
    p.add_argument("method", choices=["lad"])
    p.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a config parameter and its values (the grid is the product of all --set)")
    p.add_argument("--hardware", action="store_true",
                   help="sweep the LAD tile's bit-accurate model (LadTileConfig); default: the float LadConfig")
    p.add_argument("--tokens", action=AtLeast, default=512, help="teacher-forced WikiText-2 tokens per point (512)")
    p.add_argument("--context", action=AtLeast, minimum=0, default=0,
                   help="tokens prefilled with full attention first (0)")
    p.add_argument("--out", type=Path, default=Path("build/sweep/lad"), help="folder of points, table and plot")
    p.add_argument("--workers", action=AtLeast, default=1, help="points run at once on the local machine (1)")
    p.add_argument("--address", default=None,
                   help="a Ray cluster's address, e.g. 127.0.0.1:6390 after `ray start --head --port 6390` "
                        "(default: a new local Ray instance)")
    p.add_argument("--fresh", action="store_true", help="recompute points that are already cached")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    points = grid(args.set)
    for point in points:   # every point's config is valid before anything runs
        point_config(point, args.hardware)
    (args.out / "points").mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parent.parent)
    jobs = {}
    results: dict[int, dict] = {}
    outs = [args.out / "points" / f"{point_key(point, args)}.json" for point in points]
    for i, out in enumerate(outs):
        if out.exists() and not args.fresh:
            results[i] = json.loads(out.read_text())
        else:
            jobs[i] = (point_command(points[i], args, str(out)), str(out))
    if jobs:   # connect first: a refused --address is then the only line on stderr
        connect(args.address, args.workers)
    print(f"sweep: {len(points)} points, {len(results)} cached, {len(jobs)} to run", file=sys.stderr)
    if jobs:
        import ray
        from tqdm import tqdm
        try:
            task = ray.remote(num_cpus=1)(run_point)
            pending = {task.remote(cmd, out, root): i for i, (cmd, out) in jobs.items()}
            with tqdm(total=len(pending), desc="sweep points", file=sys.stderr) as bar:
                while pending:
                    ready, _ = ray.wait(list(pending), num_returns=1)
                    for ref in ready:
                        results[pending.pop(ref)] = ray.get(ref)
                        bar.update(1)
        finally:
            ray.shutdown()
    rows = [summarize(points[i], results[i], args.hardware, outs[i]) for i in range(len(points))]
    keys = ("delta_pct", "kv_read_pct") + (("sram_kib",) if args.hardware else ())
    if args.hardware and all(r.get("cycles_last_pct", float("nan")) == r.get("cycles_last_pct") for r in rows
                             if "error" not in r):
        keys += ("cycles_last_pct",)   # every point has its cycles (points cached before they were reported lack them)
    if args.hardware and all(r["energy_uj"] == r["energy_uj"] for r in rows if "error" not in r):
        keys += ("energy_uj",)         # every point has its energy (points run before records were kept lack it)
    front = pareto(rows, keys)
    title = (f"LAD {'tile (bit-accurate)' if args.hardware else 'float reference'} in SmolLM2-135M, "
             f"{args.tokens} WikiText-2 tokens" + (f" after {args.context}" if args.context else ""))
    (args.out / "sweep.json").write_text(json.dumps({"title": title, "rows": rows, "pareto": front,
                                                     "command": "ladmac sweep " + " ".join(argv)}, indent=1))
    write_table(rows, front, args.out / "sweep.md", args.hardware)
    plot(rows, front, args.out / "pareto.png", args.hardware, title)
    print(title)
    print((args.out / "sweep.md").read_text())
    print(f"wrote {args.out / 'sweep.json'}, {args.out / 'sweep.md'}, {args.out / 'pareto.png'}")
    failed = sum("error" in r for r in rows)
    return 1 if failed else 0
