"""WiSE-FT and model soups: interpolation endpoints, refused inputs, the uniform mean of runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_cocodr.modeling.wise import interpolate_state_dicts, wise_ensemble


def _perturbed(model_dir, seed):
    from hf_cocodr import load_encoder

    st = load_encoder(str(model_dir))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in st.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return st


def test_wise_alpha_endpoints_are_exact_and_half_is_the_mean(tiny_st_dir):
    from hf_cocodr import load_encoder

    start = load_encoder(str(tiny_st_dir))
    adapted = _perturbed(tiny_st_dir, 0)
    s, a = start.state_dict(), adapted.state_dict()
    assert any(not torch.equal(s[k], a[k]) for k in s)
    zero = interpolate_state_dicts(s, a, 0.0)
    one = interpolate_state_dicts(s, a, 1.0)
    half = interpolate_state_dicts(s, a, 0.5)
    for k in s:
        assert torch.equal(zero[k], s[k]) and torch.equal(one[k], a[k]), k
        if s[k].is_floating_point():
            assert torch.allclose(half[k], (s[k] + a[k]) / 2, atol=1e-7, rtol=0), k
    merged = wise_ensemble(start, _perturbed(tiny_st_dir, 0), 0.5)
    texts = ["alpha beta", "gamma delta epsilon"]
    ref = load_encoder(str(tiny_st_dir))
    ref.load_state_dict(half)
    assert np.array_equal(merged.encode(texts), ref.encode(texts))


def test_wise_of_a_query_side_model_interpolates_its_query_route_and_keeps_the_start_documents(tiny_st_dir):
    """An asymmetric model (the query-side distillation's: a trained query route, the start's frozen document route)
    interpolated with its plain starting model: the query vectors are those of the plain model holding the
    interpolated weights (hand-made: start + alpha x (trained - start)), the document vectors stay the start's, and
    alpha 1 / 0 give the trained / the starting query route exactly."""
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.asymmetric import query_modules, query_side_model

    start = load_encoder(str(tiny_st_dir))
    trained = _perturbed(tiny_st_dir, 5)  # what the query route learnt
    texts = ["alpha beta", "gamma delta epsilon"]

    def asymmetric():
        model = query_side_model(load_encoder(str(tiny_st_dir)))
        for mine, theirs in zip(query_modules(model), list(trained)):
            mine.load_state_dict(theirs.state_dict())
        return model

    for alpha in (0.0, 0.3, 1.0):
        merged = wise_ensemble(start, asymmetric(), alpha)
        ref = load_encoder(str(tiny_st_dir))
        ref.load_state_dict(
            {
                k: v + alpha * (trained.state_dict()[k] - v) if v.is_floating_point() else v
                for k, v in start.state_dict().items()
            }
        )
        assert np.allclose(merged.encode_query(texts), ref.encode_query(texts), atol=1e-6), alpha
        assert np.array_equal(merged.encode_document(texts), start.encode_document(texts)), alpha
    assert np.array_equal(wise_ensemble(start, asymmetric(), 1.0).encode_query(texts), trained.encode_query(texts))
    assert np.array_equal(wise_ensemble(start, asymmetric(), 0.0).encode_query(texts), start.encode_query(texts))


def test_wise_refuses_bad_alpha_and_mismatched_models(tiny_st_dir):
    s = {"w": torch.zeros(2, 3)}
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            interpolate_state_dicts(s, s, bad)
    with pytest.raises(ValueError, match="shape"):
        interpolate_state_dicts(s, {"w": torch.zeros(3, 3)}, 0.5)
    with pytest.raises(ValueError, match="differ in parameters"):
        interpolate_state_dicts(s, {"v": torch.zeros(2, 3)}, 0.5)


def test_soup_is_the_uniform_mean_of_the_runs(tiny_st_dir):
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.wise import average_state_dicts, soup

    runs = [_perturbed(tiny_st_dir, seed) for seed in (1, 2, 3)]
    sds = [r.state_dict() for r in runs]
    one = average_state_dicts(sds[:1])
    assert all(torch.equal(one[k], sds[0][k]) for k in sds[0])  # a soup of one run is that run, exactly
    mean = average_state_dicts(sds)
    for k, t in sds[0].items():
        if t.is_floating_point():
            hand = (sds[0][k].double() + sds[1][k].double() + sds[2][k].double()) / 3
            assert torch.allclose(mean[k].double(), hand, atol=1e-7, rtol=0), k
        else:
            assert torch.equal(mean[k], t), k
    merged = soup([_perturbed(tiny_st_dir, seed) for seed in (1, 2, 3)])
    ref = load_encoder(str(tiny_st_dir))
    ref.load_state_dict(mean)
    texts = ["alpha beta", "gamma delta epsilon"]
    assert np.array_equal(merged.encode(texts), ref.encode(texts))
    with pytest.raises(ValueError, match="shape"):
        average_state_dicts([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}])
    with pytest.raises(ValueError, match="at least one"):
        average_state_dicts([])
