"""Pooling: adaptive average pooling to 1x1 (``mean`` over the trailing dims, as eager lowers it,
or ``_adaptive_avg_pool2d``) and ``max_pool2d_with_indices`` (values and PyTorch's indices).
The CUDA code is in pooling.cuh (device) and pooling.cu (entry points), the C++ in pooling.cpp."""

from __future__ import annotations

from ...cards import Card, CardKind
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ...kernels.source import KernelFile
from ..base import CTYPE, FLOAT_DTYPES, input_index, numel

CUH = KernelFile(__package__, "pooling.cuh")
CU = KernelFile(__package__, "pooling.cu")
CPP = KernelFile(__package__, "pooling.cpp")


class MeanPool(Family):
    """Mean over the last k contiguous dims (rows x cols): global average pooling."""

    name = "avg_pool"

    def match(self, card: Card) -> Match | None:
        if card.kind != CardKind.OP or len(card.outputs) != 1:
            return None
        a = card.program["nodes"][0]["args"]
        kw = card.program["nodes"][0].get("kwargs", {})
        x = card.inputs[0] if card.inputs else None
        if x is None or x.dtype not in FLOAT_DTYPES or not x.contiguous or len(x.shape) < 2:
            return None
        nd = len(x.shape)
        if card.target == "aten.mean.dim":
            dims = a[1] if len(a) > 1 else None
            if not isinstance(dims, list) or not dims or kw.get("dtype") or (len(a) > 3 and a[3] is not None):
                return None
            dims = sorted(d % nd for d in dims)
            if dims != list(range(nd - len(dims), nd)):
                return None
            k = len(dims)
        elif card.target == "aten._adaptive_avg_pool2d.default":
            if a[1] != [1, 1] or nd not in (3, 4):
                return None
            k = 2
        else:
            return None
        cols = numel(x.shape[nd - k:])
        rows = numel(x.shape[:nd - k])
        if card.outputs[0].dtype not in FLOAT_DTYPES or rows == 0 or cols == 0:
            return None
        return Match(self.name, card, {"rows": rows, "cols": cols, "tin": x.dtype, "tout": card.outputs[0].dtype})

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [16, 64, 256]}
        return {"mode": ["tile", "vtile", "warp"], "threads": [64, 128, 256, 512]}

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        if p["mode"] == "tile":
            return m.info["cols"] * p["threads"] * 4 <= 48 * 1024
        if p["mode"] == "vtile":
            span = m.info["cols"] * p["threads"] * ITEMSIZE[m.info["tin"]]
            return span % 16 == 0 and span <= 48 * 1024
        return True

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 64}
        if m.info["cols"] <= 96:
            # 16-byte loads all in flight at once where the block's span allows them: faster than
            # the element-wise tile on short rows such as ResNet's 7x7 (docs/benchmarks.md)
            vt = {"mode": "vtile", "threads": 128}
            if self.valid(m, vt, backend):
                return vt
            return {"mode": "tile", "threads": 128 if m.info["cols"] * 128 * 4 <= 48 * 1024 else 64}
        return {"mode": "warp", "threads": 256}

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        i = m.info
        if backend == "cpu":
            return header(self.name, p, 1) + CPU_COMMON + CPP.fill(
                "mean_entry", tx=CPU_CTYPE[i["tin"]], to=CPU_CTYPE[i["tout"]], rows=i["rows"], cols=i["cols"],
                chunk=p["chunk"])
        threads = p["threads"]
        if p["mode"] in ("tile", "vtile"):
            launch = CU.inline("mean_" + p["mode"], threads=threads, cols=i["cols"], blocks=-(-i["rows"] // threads))
        else:
            launch = CU.inline("mean_warp", threads=threads, blocks=-(-i["rows"] // (threads // 32)))
        return header(self.name, p, 1) + CUDA_COMMON + CUH.section("mean") + CU.fill(
            "mean_entry", tx=CTYPE[i["tin"]], to=CTYPE[i["tout"]], rows=i["rows"], cols=i["cols"], launch=launch)


class MaxPool(Family):
    """max_pool2d: the op card (values and PyTorch's flat indices, both written) or the module card
    of an ``nn.MaxPool2d`` that returns the values alone (ResNet's stem), whose kernel skips the
    indices: for a 3x3/2 pool of fp16 they are 4x the bytes of the values.

    CUDA modes: ``thread`` (each thread reads its windows from global memory), ``tile`` (a block
    copies the input rows of ``rows`` output rows into shared memory with 16-byte loads, then
    computes from there) and ``strip`` (3-wide windows at stride 2 with padding 1, ResNet's pool:
    a thread takes OWV neighbouring outputs, loads the 2*OWV input columns under them in one
    vector per input row and gets the column to their left from its neighbour lane by a shuffle;
    no shared memory, no redundant loads)."""

    name = "max_pool"

    def match(self, card: Card) -> Match | None:
        nodes = card.program.get("nodes") or []
        if len(nodes) != 1 or nodes[0]["op"] != "aten.max_pool2d_with_indices.default":
            return None
        outs = card.program.get("outputs") or []
        if card.kind == CardKind.OP and len(card.outputs) == 2:
            with_idx = True
        elif card.kind == CardKind.MODULE and len(card.outputs) == 1 and outs == [{"$node": 0, "out": 0}]:
            with_idx = False
        else:
            return None
        a = nodes[0]["args"]
        x = card.inputs[input_index(a[0]) or 0]
        if x.dtype not in FLOAT_DTYPES or len(x.shape) != 4 or not x.contiguous or not card.outputs[0].contiguous:
            return None
        if with_idx and not card.outputs[1].contiguous:
            return None

        def pair(v, default):
            if v is None or v == []:
                return list(default)
            return [v[0], v[0]] if len(v) == 1 else list(v)

        k = pair(a[1], None)
        st = pair(a[2] if len(a) > 2 else None, k)
        pd = pair(a[3] if len(a) > 3 else None, [0, 0])
        dl = pair(a[4] if len(a) > 4 else None, [1, 1])
        if len(a) > 5 and a[5]:
            return None  # ceil_mode: windows past the edge; not templated
        n, c, h, w = x.shape
        oh, ow = card.outputs[0].shape[2:]
        return Match(self.name, card, {"n": n, "c": c, "h": h, "w": w, "oh": oh, "ow": ow, "k": k, "s": st,
                                       "p": pd, "d": dl, "tin": x.dtype, "tout": card.outputs[0].dtype,
                                       "idx": with_idx})

    # ---- the tile mode's geometry ----------------------------------------------------------------
    @staticmethod
    def _in_rows(i: dict, rows: int) -> int:
        """Input rows the windows of ``rows`` consecutive output rows touch (at most)."""
        return min(i["h"], (rows - 1) * i["s"][0] + (i["k"][0] - 1) * i["d"][0] + 1)

    def _tile_rows(self, i: dict) -> list[int]:
        """Output rows per block: powers of two below OH, and OH itself (a whole plane a block),
        where their input rows fit 48 KB of shared memory."""
        cand = sorted({r for r in (2, 4, 8, 16, 32) if r < i["oh"]} | {i["oh"]})
        size = ITEMSIZE[i["tin"]]
        return [r for r in cand if self._in_rows(i, r) * i["w"] * size <= 48 * 1024]

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 4, 16]}
        ax: dict[str, list] = {"mode": ["thread"], "threads": [128, 256, 512], "per_thread": [1, 2, 4], "owv": [1, 2, 4]}
        if any(self._strip_ok(m.info, v) for v in (2, 4)):
            ax["mode"].insert(0, "strip")
        rows = self._tile_rows(m.info)
        if rows:
            ax["mode"].append("tile")
            ax["rows"] = rows
        return ax

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        i = m.info
        if i["ow"] % p.get("owv", 1):
            return False
        if p.get("mode") == "tile":
            return p.get("rows") in self._tile_rows(i)
        if p.get("mode") == "strip":
            return self._strip_ok(i, p.get("owv", 1))
        return True

    @staticmethod
    def _strip_ok(i: dict, owv: int) -> bool:
        """The strip mode's columns: 3 wide, stride 2, padding 1, no dilation, OW = W / 2, and rows
        that split into whole 2*OWV-element vectors of at most 32 bytes."""
        return (owv in (2, 4) and i["k"][1] == 3 and i["s"][1] == 2 and i["p"][1] == 1 and i["d"][1] == 1
                and i["w"] == 2 * i["ow"] and i["w"] % (2 * owv) == 0 and 2 * owv * ITEMSIZE[i["tin"]] <= 32)

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 4}
        i = m.info
        # 16-byte loads: 4 outputs a thread for 2-byte types, 2 for fp32
        owv = 4 if ITEMSIZE[i["tin"]] == 2 else 2
        rows = self._tile_rows(i)
        if self._strip_ok(i, owv):
            return {"mode": "strip", "threads": 256, "per_thread": 1, "owv": owv, **({"rows": rows[-1]} if rows else {})}
        owv = 2 if i["ow"] % 2 == 0 else 1
        # Windows read from global memory (through L1) first: the shared-memory tile mode is
        # slower than the thread mode, on ResNet's pool and on a 2x2/2 pool (its blocks load their
        # rows, then compute, with nothing in flight; docs/benchmarks.md). The tile stays a move,
        # with a whole plane a block when there are planes enough to fill the GPU a few times
        # over, else the largest tile that still gives that many blocks.
        first = {"mode": "thread", "threads": 256, "per_thread": 1, "owv": owv}
        if not rows:
            return first
        planes = i["n"] * i["c"]
        enough = [r for r in rows if planes * -(-i["oh"] // r) >= 4 * device.sms]
        return {**first, "rows": max(enough) if enough else min(rows)}

    def relevant(self, p: dict) -> dict:
        """per_thread only applies to the thread mode with one output a thread; rows only to the tile mode."""
        q = dict(p)
        if q.get("owv", 1) > 1 or q.get("mode") in ("tile", "strip"):
            q.pop("per_thread", None)
        if q.get("mode") != "tile":
            q.pop("rows", None)
        return q

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        i = m.info
        with_idx = i["idx"]
        consts = CU.inline("max_consts", nc=i["n"] * i["c"], h=i["h"], w=i["w"], oh=i["oh"], ow=i["ow"], kh=i["k"][0],
                           kw=i["k"][1], sh=i["s"][0], sw=i["s"][1], ph=i["p"][0], pw=i["p"][1], dh=i["d"][0],
                           dw=i["d"][1])
        if backend == "cpu":
            return header(self.name, p, 1) + CPU_COMMON + CPP.fill(
                "max_entry", tx=CPU_CTYPE[i["tin"]], to=CPU_CTYPE[i["tout"]], consts=consts, chunk=p["chunk"],
                idx_ptr="int64_t* idx = (int64_t*)out[1].data;" if with_idx else "",
                idx_store="idx[o] = bi;" if with_idx else "(void)bi;")
        threads, owv = p["threads"], p.get("owv", 1)
        total = i["n"] * i["c"] * i["oh"] * i["ow"]
        guard = ""
        if owv > 1:
            guard += CU.fill("out_aligned", owv=owv)
            if with_idx:
                guard += CU.fill("idx_aligned")
        if p.get("mode") == "tile":
            rows = p["rows"]
            tiles = -(-i["oh"] // rows)
            blocks = i["n"] * i["c"] * tiles
            size = ITEMSIZE[i["tin"]]
            vec = 16 // size if (i["w"] * size) % 16 == 0 else 1
            if vec > 1:
                guard += CU.fill("in_aligned")
            kernel = "tile"
            consts += CU.inline("tile_consts", rows=rows, in_rows=self._in_rows(i, rows), vec=vec, tiles=tiles)
        elif p.get("mode") == "strip":
            blocks = -(-(total // owv) // threads)
            kernel = "strip"
            guard += CU.fill("strip_aligned", pair=2 * owv)
        elif owv > 1:
            blocks = -(-(total // owv) // threads)
            kernel = "owv"
        else:
            per = p["per_thread"]
            blocks = -(-total // (threads * per))
            kernel = "thread"
            consts += CU.inline("thread_consts", per=per)
        return header(self.name, p, 1) + CUDA_COMMON + CU.fill(
            "max_entry", tx=CTYPE[i["tin"]], to=CTYPE[i["tout"]], consts=consts, threads=threads, owv=owv, total=total,
            windows=CUH.section("windows"), guard=guard, blocks=blocks,
            kernel=CUH.fill(kernel, idx_param=", int64_t* __restrict__ idx" if with_idx else "",
                            idx="idx" if with_idx else "nullptr"),
            idx_arg=", (int64_t*)out[1].data" if with_idx else "")
