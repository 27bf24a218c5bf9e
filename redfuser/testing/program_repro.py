"""A failing program as a runnable script: imports, the body, the exact arrays, the calls and the assertion.

The script imports only numpy and redfuser. It builds every argument as the
fuzzer did (dtype, values, layout: broadcast and negative-stride views, masked
arrays), makes the kernel with the program's backend and options, repeats the
calls before the failing one on the same kernel object (what they compile and
cache is part of the bug), then runs the failing call and the numpy body and
asserts what the judge found (`program_judge`): the script exits non-zero while
the bug is there and 0 once it is fixed.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import replace

from .program import Arg, Program
from .program_data import scalar_source
from .program_judge import Failure


def reproducer(p: Program, f: Failure, origin: str = "") -> str:
    """The script for failure `f` of program `p` (see the module docstring)."""
    f = f if f.call < len(p.calls) else replace(f, call=len(p.calls) - 1)
    summary = "\n".join(textwrap.wrap(f.message, 100, break_long_words=False)[:10])
    lines = [f'"""RedFuser fuzzer: {f.kind} on the {f.backend} backend{origin}.', "", summary, '"""',
             "import numpy as np", "", "import redfuser as rf", "", "", p.source(), "", ""]
    names = _arguments(p, f.call, lines)
    opts = "".join(f", {k}={v!r}" for k, v in p.options)
    lines.append(f"kernel = rf.kernel(program, backend={f.backend!r}{opts})")
    lines.append("with np.errstate(all=\"ignore\"):")
    for c in range(f.call):
        lines.append(f"    kernel({', '.join(names[c])})  # call {c}: compiled and cached first")
    args = ", ".join(names[f.call])
    lines += _check(p, f, args)
    return "\n".join(lines) + "\n"


def _arguments(p: Program, upto: int, lines: list[str]) -> list[list[str]]:
    """Bind each call's arrays (reusing a variable where a call repeats an argument); the argument names."""
    seen: dict[Arg, str] = {}
    out: list[list[str]] = []
    for c in range(upto + 1):
        names = []
        for name, a in zip(p.params, p.calls[c]):
            if not a.is_array:
                names.append(scalar_source(a.scalar))
                continue
            if a not in seen:
                var = name if c == 0 else f"{name}_call{c}"
                lines += a.data.source(var, a.layout)
                seen[a] = var
            names.append(seen[a])
        out.append(names)
    lines.append("")
    return out


def _check(p: Program, f: Failure, args: str) -> list[str]:
    if f.kind == "accepted":
        return ["    try:", f"        program({args})", "    except Exception as err:",
                "        print('numpy refuses it:', type(err).__name__, err)", "    else:",
                "        raise SystemExit('numpy accepts this call: not the reported failure')",
                "    try:", f"        kernel({args})", "    except rf.CompileError as err:",
                "        print('the kernel refuses it too (fixed):', type(err).__name__)", "    else:",
                "        raise AssertionError('the kernel returned a result for a call numpy refuses')"]
    if f.kind == "mask dropped":
        return ["    try:", f"        kernel({args})", "    except rf.CompileError as err:",
                "        print('the kernel refuses the masked array (fixed):', err)", "    else:",
                "        raise AssertionError('a masked array was accepted and its mask dropped')"]
    if f.kind == "wrote memory":    # (the arguments compared with copies taken before the call)
        return [f"    arguments = ({args},)",
                "    before = [np.ma.copy(a) if isinstance(a, np.ndarray) else a for a in arguments]",
                "    kernel(*arguments)",
                "for n, (now, then) in enumerate(zip(arguments, before)):",
                "    if isinstance(now, np.ndarray):",
                "        assert np.ma.getdata(now).tobytes() == np.ma.getdata(then).tobytes(), "
                "f'argument {n} was changed by the call'",
                "print('no argument changed: fixed')"]
    if f.kind not in ("wrong value", "wrong class", "wrong dtype", "wrong shape"):
        # errors, crashes and hangs: running the call is the reproducer; a user error is right where numpy refuses
        # (a hang: the call timed as the campaign timed its worker, compile included; it said "fixed" however
        # long the call took)
        limit = re.search(r"ran ([0-9.eE+-]+) s", f.message) if f.kind == "timeout" else None
        timed = ["    import time", "    start = time.monotonic()"] if limit else []
        lines = ["    try:", f"        program({args})", "    except Exception as err:",
                 "        numpy_refuses = err", "        print('numpy refuses it:', type(err).__name__, err)",
                 "    else:", "        numpy_refuses = None", *timed, "    try:", f"        kernel({args})  # {f.kind}",
                 "    except rf.CompileError as err:", "        if numpy_refuses is None:",
                 "            raise  # a user error for a call numpy computes",
                 "        print('the kernel refuses it with a user error, as it should:', type(err).__name__)"]
        if limit:
            lines += ["seconds = time.monotonic() - start",
                      f"assert seconds <= {float(limit.group(1))!r}, f'the call took {{seconds:.3g}} s, over the "
                      f"campaign limit of {limit.group(1)} s'"]
        return lines + ["print('no failure: fixed')"]
    # (the body first: a kernel that also writes an argument would change what the body reads after it)
    lines = [f"    want = program({args})", f"    got = kernel({args})"]
    if len(p.outputs) > 1:
        lines += ["assert isinstance(got, tuple) and len(got) == len(want), 'number of outputs'",
                  f"got, want = np.asarray(got[{f.output}]), np.asarray(want[{f.output}])  # output {f.output}"]
    else:
        lines += ["got, want = np.asarray(got), np.asarray(want)"]
    lines += ["print('kernel:', got.dtype, got.shape, got.ravel()[:8])",
              "print('numpy: ', want.dtype, want.shape, want.ravel()[:8])",
              "assert got.shape == want.shape, (got.shape, want.shape)",
              "assert got.dtype == want.dtype, (got.dtype, want.dtype)"]
    if f.index is None:
        return lines
    idx = repr(f.index)
    if f.kind == "wrong class":
        lines += ["def kind(v):", "    return 'nan' if np.isnan(v) else repr(v) if np.isinf(v) else 'finite'", "",
                  f"assert kind(float(got[{idx}])) == kind(float(want[{idx}])), "
                  f"(float(got[{idx}]), float(want[{idx}]))"]
    elif f.allowed or "allowed" in f.message:
        lines += [f"error = abs(float(got[{idx}]) - float(want[{idx}]))",
                  f"assert error <= {f.allowed!r}, f'|kernel - numpy| = {{error:.4g}} at {idx}, "
                  f"allowed {f.allowed:.4g}'"]
    else:
        lines += [f"assert got[{idx}] == want[{idx}], (got[{idx}], want[{idx}])"]
    return lines
