"""spectui's screens: the chat screen, the loading screen and the dialogs."""
