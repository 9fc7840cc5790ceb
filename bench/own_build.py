"""What the repository's own build costs: once per content, then per candidate.

Builds a repository its own way (`python -u setup.py build_ext --inplace` in a copy under
a scratch cache) three times and prints the seconds of each and what it compiled:

* the original, cold (every object);
* the original again, same content (from the cache: no build at all);
* a candidate that changes one `.cu` file (torch's ninja build recompiles that object
  and relinks its library; without ninja, every source of that extension).

No GPU is needed; with a CUDA build of torch the `.cu` files are compiled too.

    .venv/bin/python bench/own_build.py [--repo fixtures/library_loop]
        [--file csrc/cuda/row_scale_cuda.cu] [--kernel row_scale_kernel]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from kfbot.config import Config
from kfbot.evaluate.build.layouts.own import OwnBuilder, own_recipe
from kfbot.evaluate.build.symbols import holders
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

ROOT = Path(__file__).resolve().parents[1]
_COMPILED = re.compile(r"^\[\d+/\d+\].*?(\S+\.(?:cu|cpp|cc|cxx|c))\b", re.MULTILINE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "fixtures" / "library_loop")
    parser.add_argument("--file", default="csrc/cuda/row_scale_cuda.cu",
                        help="the file the candidate changes (a comment is added)")
    parser.add_argument("--kernel", default="row_scale_kernel")
    args = parser.parse_args()
    root = args.repo.resolve()
    kernel = select_kernel(scan(root, Config()).kernels, args.kernel)
    recipe = own_recipe(kernel.builds[0].file if kernel.builds else "setup.py")
    with tempfile.TemporaryDirectory(prefix="kfbot-bench-own-") as tmp:
        builder = OwnBuilder(Path(tmp), timeout_s=3600, progress=_say)
        started = time.monotonic()
        cold = builder.original(root, recipe)
        print(f"original, cold:    {time.monotonic() - started:7.1f} s  ok={cold.ok}  "
              f"{len(cold.libraries)} libraries, ninja={cold.ninja}")
        if not cold.ok:
            print(cold.evidence())
            return 1
        started = time.monotonic()
        again = builder.original(root, recipe)
        print(f"original, cached:  {time.monotonic() - started:7.1f} s  cached={again.cached}")
        found = holders(kernel.definition, [cold.original / lib for lib in cold.libraries])
        if not found:
            print(f"no library holds {kernel.definition.qualified_name}")
            return 1
        library = found[0].library.relative_to(cold.original).as_posix()
        text = (root / args.file).read_text() + "\n// a candidate's change\n"
        started = time.monotonic()
        made = builder.candidate(cold, library, {args.file: text}, "bench1")
        compiled = sorted(set(_COMPILED.findall(made.tail)))
        print(f"candidate:         {time.monotonic() - started:7.1f} s  ok={made.ok}  "
              f"recompiled: {', '.join(compiled) or '(see the build output)'}")
    return 0


def _say(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
