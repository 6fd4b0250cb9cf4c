"""What an operator watches: the Grafana dashboard and its check against a live job."""
