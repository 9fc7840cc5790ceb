"""What the static anti-cheating layer costs per candidate.

    python bench/static_checks.py [--units 3] [--repeat 20]

Builds `--units` translation units of about 200 lines each (six copies of a small GELU
extension), the original and a candidate that adds one library call, and times
`static_findings` on fresh texts (nothing from its cache) after one warm-up that
compiles the queries. Prints the median and the slowest run in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kfbot.anticheat.static import static_findings
from kfbot.anticheat.units import Source, StaticInput

UNIT = """\
#include <torch/extension.h>
__global__ void gelu{i}_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {{
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
  }}
}}
torch::Tensor gelu{i}(torch::Tensor x) {{
  auto y = torch::empty_like(x);
  int n = x.numel();
  gelu{i}_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  // @host{i}
  return y;
}}
"""


def units(tag: str, count: int) -> tuple[Source, ...]:
    body = "".join(UNIT.format(i=i) for i in range(12))
    return tuple(Source(f"csrc/u{k}.cu", f"// {tag}\n{body}") for k in range(count))


def one(tag: str, count: int) -> StaticInput:
    original = units(tag, count)
    candidate = tuple(Source(s.path, s.text.replace("// @host0", "y = at::gelu(x);"))
                      for s in original)
    return StaticInput(original=original, candidate=candidate, changed={}, allowed=())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    static_findings(one("warm-up", args.units))  # compiles the queries once per process
    took = []
    for k in range(args.repeat):
        fresh = one(f"run {k}", args.units)
        start = time.perf_counter()
        found = static_findings(fresh)
        took.append((time.perf_counter() - start) * 1e3)
        assert [f.check for f in found] == ["library-call"], found
    lines = sum(s.text.count("\n") for s in one("x", args.units).original)
    print(f"static checks on {args.units} units ({lines} lines a side): "
          f"median {statistics.median(took):.1f} ms, slowest {max(took):.1f} ms "
          f"over {args.repeat} fresh candidates")


if __name__ == "__main__":
    main()
