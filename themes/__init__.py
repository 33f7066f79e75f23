"""spectui's Textual themes (dark, light, high contrast) and the app's stylesheet (app.tcss).

Token-origin colours come from the theme too, through the variables `origin-ssm1`,
`origin-ssm2`, `origin-ngram` and `origin-bonus`, so the colouring stays readable in every theme.
"""

from __future__ import annotations

from pathlib import Path

from textual.theme import Theme

STYLESHEET = Path(__file__).with_name("app.tcss")

DARK = Theme(
    name="spectui-dark",
    primary="#5fafff",
    secondary="#af87ff",
    accent="#ffaf5f",
    foreground="#e4e4e4",
    background="#121212",
    surface="#1c1c1c",
    panel="#262626",
    success="#5fd75f",
    warning="#ffd75f",
    error="#ff5f5f",
    dark=True,
    variables={
        "origin-ssm1": "#5fd7ff",
        "origin-ssm2": "#d787ff",
        "origin-ngram": "#ffd75f",
        "origin-bonus": "#ff875f",
    },
)

LIGHT = Theme(
    name="spectui-light",
    primary="#005fd7",
    secondary="#8700af",
    accent="#d75f00",
    foreground="#1c1c1c",
    background="#fafafa",
    surface="#f0f0f0",
    panel="#e4e4e4",
    success="#008700",
    warning="#af8700",
    error="#d70000",
    dark=False,
    variables={
        "origin-ssm1": "#0087af",
        "origin-ssm2": "#8700af",
        "origin-ngram": "#875f00",
        "origin-bonus": "#d75f00",
    },
)

HIGH_CONTRAST = Theme(
    name="spectui-high-contrast",
    primary="#00ffff",
    secondary="#ff00ff",
    accent="#ffff00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#000000",
    success="#00ff00",
    warning="#ffff00",
    error="#ff0000",
    dark=True,
    variables={
        "origin-ssm1": "#00ffff",
        "origin-ssm2": "#ff00ff",
        "origin-ngram": "#ffff00",
        "origin-bonus": "#ff8000",
        "border": "#ffffff",
    },
)

THEMES = (DARK, LIGHT, HIGH_CONTRAST)
