"""The aws provider against moto (docs/aws-provider.md, "Testing")."""
