# Pick a module explicitly: config.settings.embedded (default), config.settings.production or config.settings.test.
