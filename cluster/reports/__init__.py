"""What a finished run leaves besides weights: figures and measured costs."""
