"""docker-compose.yml run in real containers: see conftest.py."""
