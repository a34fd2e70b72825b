"""aleph: reproducible environment and training module of the AlephLM-0 E1 line.

Subpackages, one concern each; dependencies flow one way:
cli -> campaign -> train / eval / report -> model / targets / data -> env.
"""

__version__ = "0.1.0"
