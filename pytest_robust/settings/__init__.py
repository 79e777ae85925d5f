"""Settings: the keys, their layers and how they resolve (``keys``), and the validators every
setting and check parameter goes through (``validation``), which turn a bad value into a
``SettingError`` naming the key and the accepted values."""
