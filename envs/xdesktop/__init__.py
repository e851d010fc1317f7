"""A real X desktop in a workspace: Xvfb, a D-Bus session with AT-SPI, openbox, and the apps of the declared image
``desktop``, with OSWorld's VM API served by the workspace host (docs/osworld.md)."""
