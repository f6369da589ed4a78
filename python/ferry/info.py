"""``python -m ferry.info``: version, build options and the libfabric providers found."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import _ferry

PROVIDERS = ("efa", "tcp;ofi_rxm", "shm", "verbs;ofi_rxm")


def collect(providers: tuple[str, ...] = PROVIDERS) -> dict[str, Any]:
    """Everything `python -m ferry.info` prints, as a dict."""
    info: dict[str, Any] = {"build": dict(_ferry.build_info()), "python": sys.version.split()[0]}
    try:
        import ferry

        info["package"] = ferry.__file__
        info["extension"] = _ferry.__file__
    except Exception:  # pragma: no cover
        pass
    found = []
    for p in providers:
        error, domains = _ferry.probe_provider(p)
        found.append(
            {
                "provider": p,
                "error": error or None,
                "domains": [
                    {"name": d, "fabric": f, "provider": prov, "hmem": h} for d, f, prov, h in domains
                ],
            }
        )
    info["providers"] = found
    return info


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m ferry.info` (also installed as `ferry-py-info`)."""
    ap = argparse.ArgumentParser(prog="python -m ferry.info", description=__doc__)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--provider", action="append", help="probe only these providers")
    args = ap.parse_args(argv)
    info = collect(tuple(args.provider) if args.provider else PROVIDERS)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    b = info["build"]
    print(f"ferry {b['version']} (python {info['python']})")
    print(f"  package   : {info.get('package', '?')}")
    print(f"  extension : {info.get('extension', '?')}")
    print(f"  CUDA      : {'built' if b['cuda'] else 'not built'}")
    print(f"  libfabric : headers {b['libfabric_headers']}, runtime {b['libfabric_runtime']}")
    print(f"  nanobind  : {b['nanobind']}; compiler {b['compiler']}; assertions {b['assertions']}")
    print("providers:")
    for p in info["providers"]:
        if p["error"]:
            print(f"  {p['provider']:<14} not available ({p['error']})")
            continue
        doms = ", ".join(
            f"{d['name']}" + (" [hmem]" if d["hmem"] else "") for d in p["domains"]
        )
        print(f"  {p['provider']:<14} {len(p['domains'])} domain(s): {doms}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
