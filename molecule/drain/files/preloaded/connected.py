"""A module that opens a socket when imported: no preloading runner forks it."""
import socket

CONNECTION = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
