"""A run's configuration: the base config (``defaults``), the start-up checks that span sections
(``config_validation``), and the builders that turn a config into a run's parts (``builders``)."""
