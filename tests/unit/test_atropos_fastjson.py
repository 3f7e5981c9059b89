"""The compiled `/batch` decoder must give exactly what a JSON decoder gives, or step aside."""

import json
import random

import numpy as np
import pytest

from grpo_plugin.atropos.fastjson import FIELDS, MISSING, decode, loads


def flat(groups, key, dtype):
    rows = [r for g in groups if g.get(key) is not None for r in g[key]]
    return np.array([x for r in rows for x in r], dtype=dtype), np.array([len(r) for r in rows], dtype=np.int64)


def random_groups(seed: int) -> list[dict]:
    rnd = random.Random(seed)
    groups = []
    for _ in range(rnd.randint(1, 12)):
        n = rnd.randint(1, 5)
        toks = [[rnd.randrange(-5, 10 ** 6) for _ in range(rnd.randint(0, 30))] for _ in range(n)]
        g = {"tokens": toks, "masks": [[t if rnd.random() < 0.5 else -100 for t in r] for r in toks],
             "inference_logprobs": [[rnd.choice([1.0, -rnd.random() * 10, -1e-9 * rnd.random(), -123.5e-30, 0.0])
                                     for _ in r] for r in toks],
             "scores": [rnd.random() for _ in toks], "env_id": rnd.randrange(3)}
        if rnd.random() < 0.3:
            g["advantages"] = [[rnd.uniform(-1e3, 1e3) for _ in r] for r in toks]
        if rnd.random() < 0.3:
            g["messages"] = [[{"role": "user", "content": 'tricky "tokens": [[1, 2]] \\ ] } ['}]]
        if rnd.random() < 0.3:
            g["overrides"] = [{"temperature": 0.5}] * n
        if rnd.random() < 0.2:
            g["masks"] = None
        groups.append(g)
    return groups


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("indent", [None, 2])
def test_columns_equal_the_json_decoders_values(seed, indent):
    groups = random_groups(seed)
    raw = json.dumps({"batch": groups, "extra": {"nested": [1, [2, 3]]}}, indent=indent).encode() + b" " * 300
    rest, cols = decode(raw)
    assert cols is not None
    for key, dtype in zip(FIELDS, (np.int64, np.int64, np.float64, np.float64)):
        values, lengths = flat(groups, key, dtype)
        assert np.array_equal(cols.lengths[key], lengths), key
        if dtype is np.int64:
            assert np.array_equal(cols.values[key], values), key
        else:  # within an ulp or two of the correctly rounded value
            np.testing.assert_allclose(cols.values[key], values, rtol=1e-15, atol=0)
        expected_counts = [len(g[key]) if g.get(key) is not None else MISSING for g in groups]
        assert cols.counts[key].tolist() == expected_counts, key
    # everything else is left to the JSON decoder, intact; the per-token fields are cut out
    assert rest["extra"] == {"nested": [1, [2, 3]]}
    for g, r in zip(groups, rest["batch"]):
        assert {k: v for k, v in r.items() if k not in FIELDS} == {k: v for k, v in g.items() if k not in FIELDS}
        assert all(r.get(k) is None for k in FIELDS)


@pytest.mark.parametrize("payload", [
    '{"batch": [{"tokens": [[1, "a"]], "masks": [[1, 2]]}]}',         # a string among token ids
    '{"batch": [{"tokens": [[1, 2.5]], "masks": [[1, 2]]}]}',         # a float where an id belongs
    '{"batch": [{"tokens": [[[1]]], "masks": [[1]]}]}',               # deeper nesting
    '{"batch": [{"tokens": [[1, 2]], "inference_logprobs": [[NaN, 1.0]]}]}',
    '{"batch": [{"tokens": [[12345678901234567890123]]}]}',          # beyond int64
    '{"batch": [{"tokens": [[1]], "tokens": [[2]]}]}',                # a key twice
    '{"batch": ["not a group"]}',
    '[1, 2, 3]',
])
def test_anything_unusual_falls_back_to_the_full_decoder(payload):
    raw = payload.encode() + b" " * 300
    rest, cols = decode(raw)
    assert cols is None
    assert cols is None and rest == loads(raw)


def test_null_batch_and_small_replies():
    assert decode(b'{"batch": null}') == ({"batch": None}, None)
    rest, cols = decode(b'{"batch": [], "x": 1}' + b" " * 300)
    assert rest == {"batch": [], "x": 1} and cols is not None and cols.counts["tokens"].size == 0


def test_exponents_and_signs():
    values = [-1.5e-07, 2E+3, -0.0, 1e-320, -3.4028234663852886e+38, 123456789012345678901.0]
    raw = json.dumps({"batch": [{"tokens": [[1] * len(values)], "inference_logprobs": [values]}]}).encode()
    rest, cols = decode(raw + b" " * 300)
    np.testing.assert_allclose(cols.values["inference_logprobs"], values, rtol=1e-15, atol=1e-300)


@pytest.mark.parametrize("keys", [("tokens", "masks"), ("inference_logprobs", "advantages")])
def test_arrays_grow_in_the_middle_of_a_sequence(keys):
    """Single-digit values pack one into two bytes: far more values than the first guess at the arrays' size
    (a byte count / 8 for ids, / 16 for logprobs), so they grow mid-sequence and go on from the element that
    did not fit."""
    rows = [[i % 10 for i in range(5000)], [7] * 3000]
    group = {key: rows for key in keys}
    raw = json.dumps({"batch": [group, group]}, separators=(",", ":")).encode()
    assert 2 * sum(map(len, rows)) > len(raw) // 8
    _, cols = decode(raw)
    assert cols is not None
    for key in keys:
        values, lengths = flat([group, group], key, np.float64)
        assert cols.lengths[key].tolist() == lengths.tolist(), key
        assert np.array_equal(cols.values[key], values), key
