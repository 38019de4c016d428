"""The kubernetes provider: Squid Pods in the operator's own cluster."""
