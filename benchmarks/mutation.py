"""Mutation testing of the core modules: how many small deliberate bugs do the tests catch?

Each mutant changes one operator, comparison, constant, ``and``/``or``, ``min``/``max`` or drops
one call statement in a module (``pipelines/plan.py`` ...), written into the file in place; the
tests mapped to that module then run, and the mutant is *killed* when they fail (or time out).
The file is restored after every mutant (in ``finally``, also on Ctrl-C or SIGTERM), and the
script refuses to start when a module differs from git HEAD, so a run killed hard (SIGKILL) is
noticed and ``git checkout -- <file>`` puts it right.

Why not mutmut: mutmut 3 mutates a copy of the sources in ``mutants/``, but the folders install
as ``vidgen.<part>`` through an editable install's import hook that points at this checkout, so
the tests never import the copy; mutmut 2 mutates in place but starts a fresh runner per mutant,
and importing torch, diffusers and the stack takes ~8 s on the development machine, longer than
most modules' tests. Here the parent imports them once (then forgets every module of this
checkout), and each mutant's pytest runs in a fork that imports the mutated module fresh.

    python benchmarks/mutation.py                      # the six core modules (CORE)
    python benchmarks/mutation.py --module rope --module plan
    python benchmarks/mutation.py --module vae_stream  # a named module outside the six
    python benchmarks/mutation.py --module pipelines/x.py --tests tests/pipelines/test_x.py
    python benchmarks/mutation.py --module drift --list # the mutants, nothing run

Prints killed / survived / timed-out per module and the kill rate, (killed + timed out) over the
mutants not listed as equivalent; lists the survivors; writes a JSON report
(``outputs/mutation/report.json``). Mutants on lines the tests never run are not run and count
as survived. Run it with ``OMP_NUM_THREADS=1`` (the default it sets): forked children must not
inherit an OpenMP pool.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import gc
import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODULES: dict[str, tuple[str, list[str]]] = {
    # name: (file, the tests that exercise it -- small and fast: they run once per mutant)
    "plan": ("pipelines/plan.py", ["tests/pipelines/test_plan.py", "tests/pipelines/test_plan_summary.py"]),
    "drift": ("pipelines/drift.py", ["tests/pipelines/test_drift.py"]),
    "scheduler": ("pipelines/scheduler.py", ["tests/pipelines/test_scheduler.py"]),
    "denoiser": ("pipelines/denoiser.py", ["tests/pipelines/test_denoiser.py"]),
    "kv_cache": ("models/kv_cache.py", ["tests/models/test_kv_cache.py"]),
    "rope": ("models/rope.py", ["tests/models/test_rope.py"]),
    "vae_stream": ("pipelines/vae_stream.py", ["tests/pipelines/test_vae_stream.py"]),
}
CORE = ["plan", "drift", "scheduler", "denoiser", "kv_cache", "rope"]
"""What a run without ``--module`` mutates: the modules the kill-rate bar is for."""

# Mutants that change no behaviour, by module: "<stripped source line> :: <mutation>#<n>" (n counts
# identical line + mutation pairs in the file) -> why nothing observable changes.
EQUIVALENT: dict[str, dict[str, str]] = {
    "pipelines/plan.py": {
        "index = 0 :: `0` -> `1`#1": "always overwritten: the storyboard starts at 0 s and times are >= 0",
        "if change.start_seconds <= seconds + 1e-9: :: `<=` -> `<`#1": (
            "differs only when a change is exactly 1e-9 s after a chunk start"
        ),
        "if self.recache_on_prompt_change and index > 0: :: `>` -> `>=`#1": (
            "chunk 0 never starts a change: the entry in effect at 0 s is its own"
        ),
        "indent=1, :: `1` -> `2`#1": "whitespace of the JSON text; the plan read back is the same",
    },
    "pipelines/denoiser.py": {
        "with contextlib.nullcontext() if group[0] < sinks else cache.sinks_only(): :: `<` -> `<=`#1": (
            "the group starting at frame sink_frames is written only when the cache holds just the sinks"
        ),
        "if frames <= self.chunk_frames: :: `<=` -> `<`#1": (
            "a block-causal pattern over a single chunk hides nothing: the same as no pattern"
        ),
        "return self.model(**kwargs, return_dict=False)[0] :: `False` -> `True`#1": (
            "the output object's [0] is the same tensor"
        ),
    },
    "pipelines/drift.py": {
        "if self.mean is None or self.std is None: :: `or` -> `and`#1": (
            "mean and std are set together (apply, load_state): one is None exactly when both are"
        ),
        "if self.mean is None or self.std is None: :: `or` -> `and`#2": "as above (state)",
        "assert self.mean is not None and self.std is not None  # distance() is 0 without an anchor "
        ":: `and` -> `or`#1": "as above (a type-narrowing assert)",
    },
    "models/kv_cache.py": {
        "self.version = 0 :: `0` -> `1`#1": "the version is only compared with itself: any start does",
        "self.version += 1 :: `1` -> `2`#1": "any increase marks the change (reset)",
        "self.version += 1 :: `1` -> `2`#2": "any increase marks the change (entering showing)",
        "self.version += 1 :: `1` -> `2`#3": "any increase marks the change (leaving showing)",
        "self.version += 1 :: `1` -> `2`#4": "any increase marks the change (commit)",
        "self.slot_frames = [f if f in frames else -1 for f in before] :: `1` -> `2`#1": (
            "any negative frame marks an empty slot"
        ),
        "if frame < self.sink_frames: :: `<` -> `<=`#1": "frame sink_frames maps to slot sink_frames either way",
        **{
            f"if src == list(range(src[0], src[0] + len(src))) and dst == list(range(dst[0], dst[0] + len(dst))): "
            f":: {mutation}": "sends a contiguous write to index_copy_, which stores the same values"
            for mutation in ("`==` -> `!=`#1", "`+` -> `-`#1", "`+` -> `-`#2")
        },
        **{
            f"{line} :: `0` -> `1`#1": "the key and value buffers share shape, dtype and device"
            for line in (
                "or self._ws[0].shape[2] < need",
                "or self._ws[0].dtype != dtype",
                "or self._ws[0].device != self.k.device",
            )
        },
    },
    "pipelines/vae_stream.py": {
        'out[f"wan_cache_rep.{i}"] = torch.zeros(1) :: `1` -> `2`#1': "a marker: only its name is read",
        "self.vae.clear_cache() :: drop the call statement#2": (
            "load_state replaces the decoder's cache list whole; decode resets the conv index per frame"
        ),
    },
    "models/rope.py": {
        "dim = cos_table.shape[-1] :: drop unary `-`#1": "the tables are 2-D: shape[1] is shape[-1]",
    },
}

_BINOP_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_CMP_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_SYMBOL = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
    ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
    ast.And: "and", ast.Or: "or",
}  # fmt: skip


@dataclass
class Mutant:
    index: int
    line: int
    description: str
    key: str
    status: str = "pending"
    """killed | survived | timeout | not run (no test runs the line) | equivalent"""
    reason: str = ""


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: annotations and f-strings (strings are never mutated)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is not None:
                    annotations.append(a.annotation)
        if isinstance(node, ast.JoinedStr):  # f-string parts: message text (and 3.11 offsets are off)
            annotations.append(node)
        for annotation in annotations:
            if annotation is not None:
                skip.update(id(n) for n in ast.walk(annotation))
    return skip


def _sites(tree: ast.AST) -> list[tuple[ast.AST, int, str]]:
    """(node, variant, description) for every mutation of ``tree``, in source order."""
    skip = _skipped_nodes(tree)
    sites: list[tuple[ast.AST, int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP_SWAP:
            new = _BINOP_SWAP[type(node.op)]
            sites.append((node, 0, f"`{_SYMBOL[type(node.op)]}` -> `{_SYMBOL[new]}`"))
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAP:
                    sites.append((node, i, f"`{_SYMBOL[type(op)]}` -> `{_SYMBOL[_CMP_SWAP[type(op)]]}`"))
        elif isinstance(node, ast.BoolOp):
            other = ast.Or if isinstance(node.op, ast.And) else ast.And
            sites.append((node, 0, f"`{_SYMBOL[type(node.op)]}` -> `{_SYMBOL[other]}`"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            sites.append((node, 0, "drop `not`" if isinstance(node.op, ast.Not) else "drop unary `-`"))
        elif isinstance(node, ast.Constant) and type(node.value) in (bool, int, float):
            if isinstance(node.value, bool):
                sites.append((node, 0, f"`{node.value}` -> `{not node.value}`"))
            else:
                sites.append((node, 0, f"`{node.value!r}` -> `{node.value + 1!r}`"))
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
        ):
            sites.append((node, 0, f"`{node.func.id}` -> `{'max' if node.func.id == 'min' else 'min'}`"))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            sites.append((node, 0, "drop the call statement"))
    sites.sort(key=lambda s: (s[0].lineno, s[0].col_offset, s[1], s[2]))
    return sites


def _mutated(node: ast.AST, variant: int) -> ast.AST:
    """The node that replaces ``node`` in the mutant (``node`` itself, changed, or another)."""
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = _BINOP_SWAP[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[variant] = _CMP_SWAP[type(node.ops[variant])]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        return node.operand
    elif isinstance(node, ast.Constant):
        node.value = (not node.value) if isinstance(node.value, bool) else node.value + 1
    elif isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        node.func.id = "max" if node.func.id == "min" else "min"
    elif isinstance(node, ast.Expr):
        return ast.Pass()
    return node


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, replacement: ast.AST) -> None:
        self.target, self.replacement = target, replacement

    def visit(self, node: ast.AST) -> ast.AST:
        return self.replacement if node is self.target else self.generic_visit(node)


def _splice(source: str, node: ast.AST, replacement: str) -> str:
    """``source`` with ``node``'s text replaced: the rest of the file, comments and line numbers
    before it, stay as they are (ast offsets are UTF-8 byte columns)."""
    data = source.encode()
    starts = [0]
    for line in source.encode().splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    start = starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
    end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
    return (data[:start] + replacement.encode() + data[end:]).decode()


def list_mutants(source: str) -> list[Mutant]:
    """The mutants of a module, described (one walk of the tree: cheap)."""
    lines = source.splitlines()
    count: Counter[str] = Counter()
    mutants = []
    for i, (node, _, description) in enumerate(_sites(ast.parse(source))):
        base = f"{lines[node.lineno - 1].strip()} :: {description}"
        count[base] += 1
        mutants.append(
            Mutant(index=i, line=node.lineno, description=description, key=f"{base}#{count[base]}")
        )
    return mutants


def mutant_text(source: str, index: int) -> str:
    """The source of mutant ``index``, checked to parse to that one change and nothing else."""
    tree = ast.parse(source)
    node, variant, description = _sites(tree)[index]
    new = _mutated(node, variant)  # changes no offsets of ``node``
    text = _splice(source, node, f"({ast.unparse(new)})" if isinstance(new, ast.expr) else ast.unparse(new))
    if ast.dump(ast.parse(text)) != ast.dump(_Replace(node, new).visit(tree)):
        raise RuntimeError(f"mutant {index} (line {node.lineno}, {description}) did not splice cleanly")
    return text


def mutants_of(source: str) -> tuple[list[Mutant], list[str]]:
    """The mutants of a module and the source text of each (same order)."""
    mutants = list_mutants(source)
    return mutants, [mutant_text(source, m.index) for m in mutants]


# ---------------------------------------------------------------------------------------- running
def _git_clean(path: Path) -> bool:
    done = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], cwd=ROOT)
    return done.returncode == 0


def _own_modules() -> list[str]:
    """Modules imported from this checkout (not from the virtual environment)."""
    venv = Path(sys.prefix).resolve()
    names = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        resolved = Path(file).resolve()
        if resolved.is_relative_to(ROOT) and not resolved.is_relative_to(venv):
            names.append(name)
    return names


def warm_up(tests: list[str]) -> float:
    """Import what the tests import, then forget this checkout's modules (third-party ones stay)."""
    start = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import pytest  # noqa: F401

    with contextlib.suppress(ImportError):  # its pytest plugin imports it at the end of every run
        import hypothesis  # noqa: F401
    for test in tests:
        module = ".".join(Path(test).with_suffix("").parts)
        try:
            importlib.import_module(module)
        except Exception as error:  # the tests themselves will report it
            print(f"warning: importing {module} failed: {error!r}", file=sys.stderr)
    for name in _own_modules():
        del sys.modules[name]
    sys.path.remove(str(ROOT))
    gc.collect()
    gc.freeze()  # the children's collections skip the warmed-up heap
    return time.perf_counter() - start


def _run_child(
    pytest_args: list[str], timeout: float, traced: str | None = None, lines_file: str | None = None
) -> tuple[str, float]:
    """pytest in a forked child: ``passed`` | ``failed`` | ``timeout``, and the seconds it took.
    ``traced``: a source file whose executed line numbers the child writes to ``lines_file``."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never return into the parent's loop, whatever happens
        code = 3
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.chdir(ROOT)
            import pytest

            lines = _trace_lines(traced) if traced is not None else set()
            code = int(pytest.main(pytest_args))
            if lines_file is not None:
                sys.settrace(None)
                Path(lines_file).write_text(json.dumps(sorted(lines)))
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    deadline = start + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.perf_counter() > deadline:
                _kill(pid)
                return "timeout", time.perf_counter() - start
            time.sleep(0.02)
    except BaseException:  # interrupted: take the child down too, then restore the file
        _kill(pid)
        raise
    code = os.waitstatus_to_exitcode(status)
    if code == 5:
        raise SystemExit(f"pytest collected no tests from {pytest_args}")
    return ("passed" if code == 0 else "failed"), time.perf_counter() - start


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _trace_lines(path: str) -> set[int]:
    """Record the lines of ``path`` that run, from now on (sys.settrace, this thread and new ones)."""
    import threading

    lines: set[int] = set()

    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        if frame.f_code.co_filename == path:
            lines.add(frame.f_lineno)
            return local
        return None

    sys.settrace(tracer)
    threading.settrace(tracer)
    return lines


@dataclass
class ModuleResult:
    name: str
    path: str
    tests: list[str]
    baseline_seconds: float
    seconds: float = 0.0
    mutants: list[Mutant] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(m.status == status for m in self.mutants)

    @property
    def counted(self) -> int:
        return len(self.mutants) - self.count("equivalent")

    @property
    def kill_rate(self) -> float:
        detected = self.count("killed") + self.count("timeout")
        return detected / self.counted if self.counted else 1.0


def run_module(name: str, path: Path, tests: list[str], timeout: float | None) -> ModuleResult:
    relative = str(path.relative_to(ROOT))
    original = path.read_bytes()
    stat = path.stat()
    mutants, texts = mutants_of(original.decode())
    equivalent = EQUIVALENT.get(relative, {})
    for key in sorted(set(equivalent) - {m.key for m in mutants}):
        print(f"warning: {relative}: the equivalent mutant {key!r} no longer exists", file=sys.stderr)
    pytest_args = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:unraisableexception", *tests]
    # the baseline: the unmutated module, traced for the lines the tests run
    with tempfile.TemporaryDirectory() as scratch:
        lines_file = os.path.join(scratch, "lines.json")
        outcome, baseline = _run_child(pytest_args, 600, traced=str(path), lines_file=lines_file)
        covered = set(json.loads(Path(lines_file).read_text())) if outcome == "passed" else set()
    if outcome != "passed":
        raise SystemExit(f"{relative}: the tests {tests} fail on the unmutated module; fix that first")
    limit = timeout or max(10.0, 4 * baseline)
    result = ModuleResult(name, relative, tests, round(baseline, 2))
    print(f"{name}: {len(mutants)} mutants, tests take {baseline:.1f} s, limit {limit:.0f} s", flush=True)
    start = time.perf_counter()
    tree = ast.parse(original.decode())
    spans = {i: (n.lineno, n.end_lineno or n.lineno) for i, (n, _, _) in enumerate(_sites(tree))}
    for mutant, text in zip(mutants, texts):
        if mutant.key in equivalent:
            mutant.status, mutant.reason = "equivalent", equivalent[mutant.key]
            continue
        first, last = spans[mutant.index]
        if not covered.intersection(range(first, last + 1)):
            mutant.status = "not run"
            continue
        try:
            path.write_text(text)
            # an mtime of its own (whole seconds, as .pyc files record it): a .pyc of the original
            # or of another mutant of the same size is never taken for this one
            seconds = 2 + int(hashlib.sha1(text.encode()).hexdigest()[:7], 16)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 1_000_000_000))
            outcome, _ = _run_child(pytest_args, limit)
        finally:
            path.write_bytes(original)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        mutant.status = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[outcome]
        print(f"  {mutant.status:8s} L{mutant.line}: {mutant.description}", flush=True)
    result.seconds = round(time.perf_counter() - start, 1)
    result.mutants = mutants
    return result


def _table(results: list[ModuleResult]) -> str:
    rows = [
        "| module | mutants | killed | timed out | survived | not run | equivalent | kill rate | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        rows.append(
            f"| {r.path} | {len(r.mutants)} | {r.count('killed')} | {r.count('timeout')} | "
            f"{r.count('survived')} | {r.count('not run')} | {r.count('equivalent')} | "
            f"{r.kill_rate:.0%} | {r.seconds / 60:.1f} |"
        )
    return "\n".join(rows)


def _handle_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--module",
        action="append",
        help=f"a name ({', '.join(MODULES)}) or a file under pipelines/ or models/; repeatable "
        f"(default: {', '.join(CORE)})",
    )
    parser.add_argument("--tests", action="append", help="test files or ids for a --module given as a file")
    parser.add_argument(
        "--timeout", type=float, help="seconds per mutant (default: 4x the tests' time, >= 10)"
    )
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--report", default="outputs/mutation/report.json")
    args = parser.parse_args(argv)

    chosen: list[tuple[str, Path, list[str]]] = []
    for item in args.module or CORE:
        if item in MODULES:
            file, tests = MODULES[item]
        else:
            file, tests = item, list(args.tests or [])
            if not tests:
                parser.error(f"--module {item}: name its tests with --tests")
        path = (ROOT / file).resolve()
        if not path.is_file() or path.parent.name not in ("pipelines", "models"):
            parser.error(f"--module {item}: not a file under pipelines/ or models/")
        chosen.append((Path(file).stem, path, tests))

    if args.list:
        for name, path, _ in chosen:
            for m in list_mutants(path.read_text()):
                print(f"{name} #{m.index} L{m.line}: {m.key}")
        return 0

    dirty = [str(p.relative_to(ROOT)) for _, p, _ in chosen if not _git_clean(p)]
    if dirty:
        print(
            f"refusing to mutate files that differ from git HEAD: {', '.join(dirty)} "
            "(commit them, or `git checkout -- <file>` if a run was killed)",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    warm = warm_up(sorted({t.split("::")[0] for _, _, tests in chosen for t in tests}))
    # after the warm-up: an imported library may install handlers of its own
    signal.signal(signal.SIGTERM, _handle_sigterm)
    signal.signal(signal.SIGHUP, _handle_sigterm)
    print(f"imports warmed up in {warm:.1f} s", flush=True)

    results = []
    for name, path, tests in chosen:
        results.append(run_module(name, path, tests, args.timeout))
    print()
    print(_table(results))
    print(f"{(time.perf_counter() - started) / 60:.1f} minutes in all, warm-up and baselines included")
    for r in results:
        for m in r.mutants:
            if m.status in ("survived", "not run"):
                print(f"{m.status}: {r.path}:{m.line}: {m.key}")
    report = Path(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(
        json.dumps(
            [
                {**{k: v for k, v in asdict(r).items() if k != "mutants"}, "kill_rate": r.kill_rate,
                 "counts": Counter(m.status for m in r.mutants), "mutants": [asdict(m) for m in r.mutants]}
                for r in results
            ],
            indent=1,
        )
    )  # fmt: skip
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
