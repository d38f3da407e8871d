"""mpi_test.sh's comparisons, each to a relative tolerance: `losses A B`
(data_parallel_steps' step losses, and its MLP's parameter digest), `last-epoch-loss A B` (the trainer's JSON
lines) and `checkpoints A B` (every f32 of two checkpoints: parameters and
optimizer state). Exits 1 naming the first difference."""
import json
import sys

import numpy as np

RTOL = 1e-5


def payload(path):
    with open(path, "rb") as f:
        data = f.read()
    header_end = data.index(b"\n") + 1
    footer = data.rindex(b"fnv1a64 ")
    return json.loads(data[:header_end]), np.frombuffer(data[header_end:footer], dtype=np.float32)


def close(a, b, what):
    """Each element within RTOL of the larger, or of the tensor's scale (its
    largest magnitude) for elements near zero: float32 sums taken in another
    order differ there by ulps of the tensor's scale, not of the element."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        sys.exit(f"{what}: shapes differ: {a.shape} vs {b.shape}")
    scale = max(np.abs(a).max(initial=0), np.abs(b).max(initial=0))
    bad = np.abs(a - b) > RTOL * np.maximum(np.maximum(np.abs(a), np.abs(b)), scale)
    if bad.any():
        i = int(np.argmax(bad))
        sys.exit(f"{what}: element {i}: {a.flat[i]!r} vs {b.flat[i]!r} (relative tolerance {RTOL})")
    print(f"{what}: {a.size} values agree to {RTOL}")


kind, a, b = sys.argv[1:4]
def last_json(path):
    return json.loads(open(path).read().strip().splitlines()[-1])


if kind == "losses":  # data_parallel_steps: every step's, and the parameters' digest when there is one
    close(last_json(a)["losses"], last_json(b)["losses"], f"step losses of {a} and {b}")
    if "params" in last_json(a):  # each number on its own: RTOL of it, with a floor of 1e-6
        pa, pb = (np.hstack([np.ravel(x) for x in last_json(p)["params"]]) for p in (a, b))
        if pa.shape != pb.shape or (np.abs(pa - pb) > RTOL * np.maximum(np.abs(pa), np.abs(pb)) + 1e-6).any():
            sys.exit(f"parameters of {a} and {b} differ: {pa[:8]} vs {pb[:8]}")
        print(f"parameter sums and elements of {a} and {b}: {pa.size} values agree to {RTOL}")
elif kind == "last-epoch-loss":  # the trainer: its last epoch's mean
    close(last_json(a)["epochs"][-1]["loss"], last_json(b)["epochs"][-1]["loss"], f"last epoch's loss of {a} and {b}")
else:
    (ha, pa), (hb, pb) = payload(a), payload(b)
    if ha["epoch"] != hb["epoch"] or ha["tensors"] != hb["tensors"]:
        sys.exit(f"{a} and {b} hold different epochs or tensors")
    at = 0
    for tensor in ha["tensors"]:  # each tensor to its own scale
        n = int(np.prod(tensor["shape"]))
        close(pa[at:at + n], pb[at:at + n], f"{tensor['name']} of {a} and {b}")
        at += n
    if at != pa.size:
        sys.exit(f"{a}: {pa.size - at} values after the header's tensors")
