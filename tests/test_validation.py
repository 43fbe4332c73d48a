import numpy as np
import pytest
import torch
from helpers import make_inputs

from gramcheck import variants as V


@pytest.mark.parametrize("bad,arg", [(np.nan, "q"), (np.inf, "q")])
def test_nonfinite_input_names_argument(bad, arg):
    q, k, v, _ = make_inputs("softmax")
    q[0, 0, 3, 1] = bad
    with pytest.raises(ValueError, match=rf"^{arg}: contains NaN or Inf"):
        V.get("softmax").reference(q, k, v)
    with pytest.raises(ValueError, match=rf"^{arg}: contains NaN or Inf"):
        V.get("softmax").torch(torch.tensor(q), torch.tensor(k), torch.tensor(v))


def test_wrong_rank_and_mismatched_shapes():
    q, k, v, _ = make_inputs("linear-elu")
    with pytest.raises(ValueError, match=r"^q: got shape \(2, 24, 8\) \(rank 3\); expected rank 4"):
        V.get("linear-elu").reference(q[0], k, v)
    with pytest.raises(ValueError, match="^k: got shape"):
        V.get("linear-elu").reference(q, k[:, :, :5], v)
    with pytest.raises(ValueError, match="^v: got shape"):
        V.get("linear-elu").reference(q, k, v[:, :1])


def test_dtype_and_kind_mismatch():
    q, k, v, _ = make_inputs("linear-elu")
    with pytest.raises(ValueError, match="^k: got dtype float32; expected float64"):
        V.get("linear-elu").torch(torch.tensor(q), torch.tensor(k).float(), torch.tensor(v))
    with pytest.raises(ValueError, match="^q: got dtype int64"):
        V.get("linear-elu").reference(q.astype(np.int64), k, v)
    with pytest.raises(TypeError, match="^k: is a ndarray"):
        V.get("linear-elu").torch(torch.tensor(q), k, torch.tensor(v))


def test_gates_and_projection_checks():
    q, k, v, ex = make_inputs("gla")
    with pytest.raises(ValueError, match="^g: has entries outside"):
        V.get("gla").reference(q, k, v, causal=True, g=-ex["g"] + 1.0)
    with pytest.raises(ValueError, match="^g: required"):
        V.get("gla").reference(q, k, v, causal=True)
    with pytest.raises(ValueError, match="^causal: got False"):
        V.get("gla").reference(q, k, v, causal=False, g=ex["g"])
    q, k, v, ex = make_inputs("performer-positive")
    with pytest.raises(ValueError, match=r"^projection: got shape \(16, 3\)"):
        V.get("performer-positive").reference(q, k, v, projection=ex["projection"][:, :3])


def test_unknown_names():
    with pytest.raises(ValueError, match="^variant: got 'nope'"):
        V.get("nope")
    q, k, v, _ = make_inputs("softmax")
    with pytest.raises(ValueError, match="^temperature: not a hyperparameter"):
        V.get("softmax").reference(q, k, v, temperature=2.0)
    with pytest.raises(ValueError, match="^form: got 'fused'"):
        V.get("softmax").torch(torch.tensor(q), torch.tensor(k), torch.tensor(v), form="fused")
    with pytest.raises(ValueError, match="^chunk_size: got 0"):
        V.get("linear-elu").torch(torch.tensor(q), torch.tensor(k), torch.tensor(v), chunk_size=0)


def test_causal_parallel_linear_form_is_refused():
    """The ungated parallel form is non-causal only: a causal one would materialise N x N."""
    q, k, v, _ = make_inputs("linear-elu")
    with pytest.raises(ValueError, match="^form: 'parallel' of variant 'linear-elu' is non-causal only"):
        V.get("linear-elu").torch(torch.tensor(q), torch.tensor(k), torch.tensor(v), causal=True, form="parallel")
