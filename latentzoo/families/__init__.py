"""The zoo's registry entries, one module per family; :func:`latentzoo.registry.families` imports
every module here, so a new family is one new module (see ``docs/adding_a_family.md``)."""
