"""A batch's key/value cache: kept caches land right-aligned with zeros where rows are padded, room is
reserved to decode in place, and rows that leave are closed up without a second copy."""

from __future__ import annotations

import pytest
import torch

from sessionrl.policy.kvcache import KV, RoomyLayer, batch_cache, packed


def kept(tokens: int, fill: float, layers: int = 2) -> KV:
    """A kept cache of `tokens` positions, ``[heads=2, T, head_dim=3]`` a layer: keys `fill` (plus the
    layer's index), values their negation."""
    return tuple(
        (torch.full((2, tokens, 3), fill + layer), torch.full((2, tokens, 3), -fill - layer))
        for layer in range(layers)
    )


def test_kept_caches_are_laid_out_right_aligned_with_room_to_decode() -> None:
    cache = batch_cache([kept(3, 1.0), None, kept(1, 5.0)], [3, 0, 1], layers=2, room=4)
    assert cache is not None
    for layer, held in enumerate(cache.layers):
        assert isinstance(held, RoomyLayer)
        assert held.buffers is not None
        assert held.buffers[0].shape == (3, 2, 3 + 4, 3)  # three kept slots and the room
        keys, values = held.keys, held.values
        assert keys.shape == (3, 2, 3, 3)
        assert bool((keys[0] == 1.0 + layer).all())
        assert bool((values[0] == -1.0 - layer).all())
        assert bool((keys[1] == 0).all())  # nothing reused: padding
        assert bool((keys[2, :, :2] == 0).all())
        assert bool((keys[2, :, 2] == 5.0 + layer).all())


def test_without_room_the_cache_appends_and_without_reuse_there_is_none() -> None:
    assert batch_cache([None, None], [0, 0], layers=2, room=None) is None
    appending = batch_cache([kept(2, 1.0)], [2], layers=2, room=None)
    assert appending is not None
    assert not isinstance(appending.layers[0], RoomyLayer)


def test_packed_copies_the_chosen_positions_into_one_block() -> None:
    keys = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    layers = [(keys, -keys), (keys + 100, -keys - 100)]
    kv = packed(layers, torch.tensor([0, 2, 3]))
    torch.testing.assert_close(kv[1][0], (keys + 100)[:, [0, 2, 3]], atol=0, rtol=0)
    torch.testing.assert_close(kv[0][1], -keys[:, [0, 2, 3]], atol=0, rtol=0)
    assert kv[0][0].untyped_storage().data_ptr() == kv[1][1].untyped_storage().data_ptr()


def test_a_closed_up_cache_keeps_its_buffers_and_its_rows() -> None:
    layer = RoomyLayer(room=4)
    keys, values = torch.randn(4, 2, 6, 3), torch.randn(4, 2, 6, 3)
    layer.hold(keys.clone(), values.clone(), length=5)
    held = layer.buffers
    assert held is not None
    layer.batch_select_indices(torch.tensor([1, 3]))
    assert layer.buffers is not None
    assert layer.buffers[0].data_ptr() == held[0].data_ptr()
    torch.testing.assert_close(layer.keys, keys[[1, 3], :, :5], atol=0, rtol=0)
    torch.testing.assert_close(layer.values, values[[1, 3], :, :5], atol=0, rtol=0)
    with pytest.raises(ValueError, match="ascend"):
        layer.batch_select_indices(torch.tensor([1, 0]))
