"""`eyrie crd`: print the CustomResourceDefinition generated from the spec model."""

from __future__ import annotations

import argparse
import sys


def crd_main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="eyrie crd", description="Print the CRD generated from the spec model.") \
        .parse_args(argv)
    from eyrie.jobs.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0
