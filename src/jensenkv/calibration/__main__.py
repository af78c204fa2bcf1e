"""``python -m jensenkv.calibration``: fit per-(layer, head) correction strengths (jensenkv.calibration.fit)."""
from jensenkv.calibration.fit import main

if __name__ == "__main__":
    main()
