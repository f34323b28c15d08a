/* XROW(r): the element offset of softmax input row r (forge_tui/templates/families/softmax.py,
   row_layout): contiguous rows, or rows in two strided dims (the logits of the last positions). */

//@section one
#define XROW(r) ((int64_t)(r) * ${s0}LL)
//@section two
#define XROW(r) ((int64_t)(r) / ${n1} * ${s0}LL + (int64_t)(r) % ${n1} * ${s1}LL)
