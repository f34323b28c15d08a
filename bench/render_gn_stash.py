"""Write the group_norm template's stash-mode CUDA source (the configuration run D measured best)
for the fp32 anchor shape (2, 512, 128, 128), 32 groups, to a file, for bench/ring_timeline.cu to
time next to its own kernels in the same harness:  python bench/render_gn_stash.py /tmp/gn.cu"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forge_tui.templates.base import Match  # noqa: E402
from forge_tui.templates.families.groupnorm import GroupNorm  # noqa: E402
from ring_phases import _gn_info  # noqa: E402

info = _gn_info(2, 512, 128, 128, 32, "float32")
fam = GroupNorm()
m = Match("group_norm", None, info)
p = {**fam.initial(m, "cuda"), "mode": "stash", "cl": 8, "threads": 1024, "bps": 2}
src = fam.render(m, p, "cuda")
Path(sys.argv[1]).write_text(src)
print("rendered", p)
