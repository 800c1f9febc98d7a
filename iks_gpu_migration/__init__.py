"""Components and dynamic providers of the gpu-migration program."""
