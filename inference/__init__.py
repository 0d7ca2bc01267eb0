"""Inference for the zoo: hand-derived Gibbs kernels, CAVI / EM drivers, correctness checks."""
