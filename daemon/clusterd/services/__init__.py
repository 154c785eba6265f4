"""The daemon's services: where request logic lives. Socket handlers stay thin and call these."""
