"""Checks <module>/pyproject.toml's version equals gem_<module>.__version__."""
import importlib
import sys
import tomllib

if __name__ == "__main__":
    mod = sys.argv[1]
    with open(f"{mod}/pyproject.toml", "rb") as f:
        meta = tomllib.load(f)["project"]
    pkg = importlib.import_module(f"gem_{mod}")
    if meta["name"] != f"gem-{mod}":
        sys.exit(f"{mod}/pyproject.toml name {meta['name']!r} must be 'gem-{mod}'")
    if meta["version"] != pkg.__version__:
        sys.exit(f"{mod}/pyproject.toml version {meta['version']} != gem_{mod}.__version__ {pkg.__version__}")
    if not getattr(pkg, "__all__", None) or len(pkg.__all__) > 16:
        sys.exit(f"gem_{mod}.__all__ must list the public API (1..16 names), got {getattr(pkg, '__all__', None)}")
    print(f"gem-{mod} {meta['version']}: ok")
