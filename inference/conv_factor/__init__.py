"""Convolutional factor analysis (one layer): the exact block Gibbs table and its pieces."""

from latentzoo.inference.conv_factor.gibbs import (
    W_update,
    alpha_update,
    atom_conditional,
    atom_natural,
    b_logits,
    b_update,
    beta_update,
    cfa_updates,
    d_update,
    gamma_update,
    residual,
)
from latentzoo.inference.conv_factor.element_move import element_move
from latentzoo.inference.conv_factor.joint_b import birth_log_ratio, joint_b_move
from latentzoo.inference.conv_factor.restore import Restored, psnr, restore, restore_with_atoms
from latentzoo.inference.conv_factor.shifts import (
    class_conditional,
    colour_grid,
    draw_maps_coloured,
    draw_maps_parallel,
    max_pool,
    scan_from_zero,
)

__all__ = [
    "cfa_updates", "W_update", "b_update", "d_update", "gamma_update", "alpha_update",
    "beta_update", "residual", "b_logits", "atom_natural", "atom_conditional",
    "class_conditional", "colour_grid", "draw_maps_coloured", "draw_maps_parallel", "max_pool",
    "joint_b_move", "birth_log_ratio", "element_move", "scan_from_zero", "restore", "restore_with_atoms",
    "Restored", "psnr",
]
