"""One analysis per module, each a function from one rank's event DataFrame to a DataFrame;
the facade (traces/analysis.py) runs them over ranks and steps."""
