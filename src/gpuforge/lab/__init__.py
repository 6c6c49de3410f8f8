"""The container lab: podman, the node image, the signed package mirror and lab clusters."""
