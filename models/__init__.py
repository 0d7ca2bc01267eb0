"""The zoo's generative models: plain NumPyro programs with the papers' priors in plain sight."""
