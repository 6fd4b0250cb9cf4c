"""python -m diffusion.tiny --family sd3|flux|sana|qwen_image --out DIR [--seed 0]"""

from __future__ import annotations

import argparse

from diffusion.tiny import BUILDERS, save_tiny_pipeline


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--family", required=True, choices=sorted(BUILDERS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = save_tiny_pipeline(args.family, args.out, args.seed)
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"wrote the tiny {args.family} pipeline to {folder} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
