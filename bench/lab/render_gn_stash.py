"""Answers (with ring_timeline.cu): how does the group_norm template's own stash mode time next to
hand-written ring variants in one harness? Writes that stash-mode CUDA source (clusters of 8,
1024 threads, 2 blocks an SM) for the fp32 anchor shape (2, 512, 128, 128), 32 groups, to a file
that bench/lab/ring_timeline.cu includes with -DPRODUCT_STASH:

    python bench/lab/render_gn_stash.py /tmp/gn.cu
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: forge_tui
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/lab: ring_phases

from ring_phases import _gn_info  # noqa: E402

from forge_tui.kernels.family import Match  # noqa: E402
from forge_tui.templates.families.group_norm import GroupNorm  # noqa: E402

if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
    raise SystemExit(__doc__)
info = _gn_info(2, 512, 128, 128, 32, "float32")
fam = GroupNorm()
m = Match("group_norm", None, info)
p = {**fam.initial(m, "cuda"), "mode": "stash", "cl": 8, "threads": 1024, "bps": 2}
src = fam.render(m, p, "cuda")
Path(sys.argv[1]).write_text(src)
print("rendered", p)
