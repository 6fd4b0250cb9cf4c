"""The run's configuration: its schema and rules, reading it, and checking its inputs."""
