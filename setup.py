"""Package discovery for the one import namespace over three folders.

``pyproject.toml`` maps ``latentzoo``, ``latentzoo.models`` and ``latentzoo.inference`` to the
folders ``latentzoo/``, ``models/`` and ``inference/``; setuptools installs only listed packages,
so the subpackages below each folder (a new family's ``inference/<family>/``) are found here and
a new family needs no packaging edit.
"""

from setuptools import find_packages, setup

FOLDERS = {"latentzoo": "latentzoo", "latentzoo.models": "models", "latentzoo.inference": "inference"}

packages = []
for name, folder in FOLDERS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages)
