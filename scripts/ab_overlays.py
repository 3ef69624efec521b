"""Write A/B overlays for `bash scripts/gpu_job.sh overlays`: ab_variants/NAME/ holds copies of
the engine files a recipe changes, each with one exact text replacement applied.

    python scripts/ab_overlays.py ko_attn ko_comb pdl_attn     # named recipes
    python scripts/ab_overlays.py --list

The overlays stage runs the decode benchmark with each ab_variants/NAME over a copy of hotspec/,
so one device call compares several kernel variants against the default code. Knockouts (ko_*,
kb_*) compute wrong results on purpose: they only time what the step costs without a piece of
work (RESULTS "Session 15"). A recipe whose text is no longer in the source stops with its name,
so a stale recipe never runs the default code under a variant's name.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ATTN = "hotspec/layers/attention/"
KERNELS, BACKEND, MERGE = ATTN + "triton_kernels.py", ATTN + "triton_backend.py", ATTN + "merge_kernels.py"

_LAUNCHED = "    pdl.launch_dependents(PDL)  # the kernel after it (o_proj's GEMV) may launch now\n"
_ATTN_RETURN = (KERNELS, _LAUNCHED + "    pid0 = tl.program_id(0)",
                _LAUNCHED + "    if num_splits > -1:  # KNOCKOUT: attention does nothing\n"
                "        return\n    pid0 = tl.program_id(0)")
_COMB_WAIT = "    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this\n"
_COMB_RETURN = (MERGE, _COMB_WAIT, _COMB_WAIT + "    if num_splits > -1:  # KNOCKOUT: the combine does "
                "nothing\n        return\n")
_PDL_ATTN = (BACKEND, "        use_pdl, pdl_wait = pdl.enabled(q.device), pdl.chained(q.device, t)\n"
             "        launch = pdl.launch_kwargs(q.device, t)",
             "        use_pdl = pdl.enabled(q.device)\n        pdl_wait = use_pdl  # VARIANT\n"
             "        launch = {\"launch_pdl\": True} if use_pdl else {}")
_WARPS = "        num_warps = self.num_warps or 4"
_ST1 = (BACKEND, "num_warps=num_warps, num_stages=self.num_stages, **launch,",
        "num_warps=num_warps, num_stages=1 if p.width == 1 else self.num_stages, **launch,")

# name -> [(file, old text, new text), ...]
RECIPES: dict[str, list[tuple[str, str, str]]] = {
    "ko_attn": [_ATTN_RETURN],
    "ko_comb": [_COMB_RETURN],
    "ko_both": [_ATTN_RETURN, _COMB_RETURN],
    "ko_comb_launch": [(BACKEND, "        if splits > 1:\n            comb_wait",
                        "        if splits > 1 and splits < 0:  # KNOCKOUT: no combine launch\n"
                        "            comb_wait")],
    "kb_noloop": [(KERNELS, '    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)',
                   '    hi = lo  # KNOCKOUT: no kv tiles\n'
                   '    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)')],
    "kb_nofold": [(KERNELS, "        if (lo <= new) & (new < hi):",
                   "        if (lo <= new) & (new < hi) & (num_splits < 0):  # KNOCKOUT"),
                  (KERNELS, "        tl.debug_barrier()  # the stores above",
                   "        pass  # KNOCKOUT tl.debug_barrier()  # the stores above")],
    "kb_noqrope": [(KERNELS, "    if ROPE:  # q arrives unrotated",
                    "    if False:  # KNOCKOUT q arrives unrotated")],
    "kb_deadexit": [(KERNELS, "    if ROPE:  # decode: the program whose kv range holds",
                     "    if hi <= lo:  # KNOCKOUT: dead splits exit\n        return\n"
                     "    if ROPE:  # decode: the program whose kv range holds")],
    # K/V tiles read with L2 evict_last (the weights stream with evict_first), so that the
    # context's K/V may stay in L2 from one step to the next (unmeasured). Decode with one stage:
    # the pipelined cp.async loads (LDGSTS) drop the hint, plain loads keep it (LDG.E.EL.128)
    "kv_evict_last": [_ST1,
        (KERNELS, "                         mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [D, N]",
         "                         mask=n_ok[None, :] & d_ok[:, None], other=0.0,\n"
         "                         eviction_policy=\"evict_last\")  # VARIANT [D, N]"),
        (KERNELS, "                kt = tl.load(k_base + slot[None, :] * stride_kt + d[:, None])",
         "                kt = tl.load(k_base + slot[None, :] * stride_kt + d[:, None],\n"
         "                             eviction_policy=\"evict_last\")  # VARIANT"),
        (KERNELS, "                        mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # [N, D]",
         "                        mask=n_ok[:, None] & d_ok[None, :], other=0.0,\n"
         "                        eviction_policy=\"evict_last\")  # VARIANT [N, D]"),
        (KERNELS, "            v = tl.load(v_base + slot[:, None] * stride_vt + d[None, :])",
         "            v = tl.load(v_base + slot[:, None] * stride_vt + d[None, :],\n"
         "                        eviction_policy=\"evict_last\")  # VARIANT")],
    "pdl_attn": [_PDL_ATTN],
    "pdl_both": [_PDL_ATTN, (BACKEND, "            comb_wait = pdl.chained(q.device, t)",
                             "            comb_wait = use_pdl  # VARIANT")],
    "st1": [_ST1],
    **{f"w{w}": [(BACKEND, _WARPS, f"        num_warps = self.num_warps or ({w} if p.width == 1 else 4)")]
       for w in (1, 2, 8)},
}


def write(name: str, out: Path) -> list[str]:
    """Apply recipe `name` to the current sources into out/name/; returns the files written."""
    files: dict[str, str] = {}
    for rel, old, new in RECIPES[name]:
        text = files.get(rel) or (ROOT / rel).read_text()
        if text.count(old) != 1:
            raise SystemExit(f"recipe {name}: its text is not in {rel} exactly once; update the recipe")
        files[rel] = text.replace(old, new)
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    for rel, text in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="recipes to write (see --list)")
    ap.add_argument("--list", action="store_true", help="print the recipes and exit")
    ap.add_argument("--out", type=Path, default=ROOT / "ab_variants", help="where to write them")
    args = ap.parse_args(argv)
    if args.list or not args.names:
        print("\n".join(sorted(RECIPES)))
        return 0
    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        raise SystemExit(f"unknown recipe(s) {unknown}; known: {', '.join(sorted(RECIPES))}")
    for name in args.names:
        print(name, " ".join(write(name, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
