"""Only the optional C accelerator lives here; everything else is in pyproject.toml.

``service._regonative`` speeds up building policy input documents (see service/rego.py). It is
optional: without a C compiler the build goes on without it and service/rego.py uses its
pure-Python converter, which produces the same input.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("service._regonative", sources=["service/_regonative.c"], optional=True),
    ]
)
