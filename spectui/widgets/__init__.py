"""spectui's widgets: conversation, prompt input, token tree, acceptance panel, status line."""
