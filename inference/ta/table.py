"""The TA and MTA update tables in sweep order (the records are in
:mod:`latentzoo.inference.ta.gibbs` and :mod:`latentzoo.inference.ta.moves`)."""

from __future__ import annotations

from .gibbs import Psi_update, group_update, label_group_update, label_update, loadings_update, pi_update
from .moves import collapsed_group_move
from .shift import shift_move

__all__ = ["ta_updates", "mta_updates"]


def ta_updates(d=(2, 2), *, collapsed_move: bool = True, shift: bool = True) -> list:
    """The TA table in sweep order: every group in turn, then (W, T, mu), then Psi; with
    ``collapsed_move`` (J >= 2) the partially collapsed move on the last group
    (:mod:`latentzoo.inference.ta.moves`) after the sweep; with ``shift`` (J = 2) the shift
    interweaving moves of both groups (:mod:`latentzoo.inference.ta.shift`)."""
    table = [*(group_update(j) for j in range(len(d))), loadings_update(), Psi_update()]
    if collapsed_move and len(d) >= 2:
        table.append(collapsed_group_move(len(d) - 1, 0))
    if shift and len(d) == 2:
        table += [shift_move(0), shift_move(1)]
    return table


def mta_updates(d=(2, 2), *, collapsed_move: bool = True, shift: bool = True) -> list:
    """The MTA table: the (c, z_1) block, ``c | z`` as its stand-in (dropped while the block
    owns c), z_1 | c as the block's stand-in for z_1, the other groups, (W, T, mu), Psi, pi;
    with ``collapsed_move`` (J >= 2) the partially collapsed move on the last group with z_1
    and the label integrated out; with ``shift`` (J = 2) the shift moves of both groups, per
    component."""
    table = [
        label_group_update(0),
        label_update(),
        *(group_update(j) for j in range(len(d))),
        loadings_update(),
        Psi_update(),
        pi_update(),
    ]
    if collapsed_move and len(d) >= 2:
        table.append(collapsed_group_move(len(d) - 1, 0, mixture=True))
    if shift and len(d) == 2:
        table += [shift_move(0), shift_move(1)]
    return table
