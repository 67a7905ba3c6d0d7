# A typical piece of LLM-written analysis: load a table with pandas, summarise it, and save a
# chart with matplotlib. Run it in the `default` image:
#
#   corral run examples/analysis.py --out out                         # generated data
#   corral run examples/analysis.py --file sales.csv --out out        # your CSV
#
# A CSV needs a date column and a numeric column (the first of each is used); without one the
# script makes up a year of daily sales for three shops. The chart lands in out/chart.png.
import glob
import sys

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

csv_files = sorted(glob.glob("*.csv"))
if csv_files:
    df = pd.read_csv(csv_files[0])
    dates = [c for c in df.columns if pd.api.types.is_string_dtype(df[c])]
    numbers = df.select_dtypes("number").columns
    if not dates or numbers.empty:
        sys.exit(f"{csv_files[0]}: need a date column and a numeric column, got {list(df.columns)}")
    df[dates[0]] = pd.to_datetime(df[dates[0]])
    df = df.set_index(dates[0])[[numbers[0]]]
    source = csv_files[0]
else:
    rng = np.random.default_rng(42)
    days = pd.date_range("2024-01-01", periods=366, freq="D")
    season = 1 + 0.3 * np.sin(np.arange(len(days)) / 365 * 2 * np.pi)
    df = pd.DataFrame(
        {shop: rng.gamma(9, 12 * scale, len(days)) * season for shop, scale in
         [("Lisbon", 1.0), ("Oslo", 1.4), ("Lima", 0.8)]},
        index=days,
    )
    source = "generated data"

monthly = df.resample("MS").sum()
print(f"{source}: {len(df)} rows, {len(df.columns)} series")
print(monthly.round(0).astype(int).to_string())
print("\ntotal per series:")
print(df.sum().round(0).astype(int).to_string())

fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
monthly.plot(ax=ax, marker="o")
ax.set_title(f"Monthly totals ({source})")
ax.set_xlabel("")
ax.set_ylabel("total")
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig("chart.png")
print("\nwrote /workspace/chart.png")
