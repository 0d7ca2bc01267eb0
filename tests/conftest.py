import warnings

import latentzoo  # noqa: F401  (float64 before any test builds arrays)

# ArviZ 0.2x announces its 1.x refactor on import; it is not about this project.
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
