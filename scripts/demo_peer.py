#!/usr/bin/env python3
"""Tiny clients and servers for the live demo (run inside a netns)."""
import socket
import struct
import sys


def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def echo_server(host, port, tag):
    s = socket.socket(family(host), socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(16)
    while True:
        c, peer = s.accept()
        data = c.recv(1024)  # one line, sent in one segment by tcp_client
        c.sendall(f"{tag} saw a connection from {peer[0]} port {peer[1]}: {data.decode().strip()}\n".encode())
        c.close()


def tcp_client(host, port, msg):
    with socket.create_connection((host, int(port)), timeout=3) as c:
        c.sendall(msg.encode() + b"\n")
        print("    reply:", c.recv(1024).decode().strip())


def dns_query(host, port="53"):
    q = struct.pack("!HHHHHH", 0x5a5a, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in "example.com".split(".")) + b"\0"
    q += struct.pack("!HH", 1, 1)
    s = socket.socket(family(host), socket.SOCK_DGRAM)
    s.settimeout(3)
    s.connect((host, int(port)))  # connected: accepts answers from host:port only
    s.send(q)
    r = s.recv(512)
    ip = socket.inet_ntoa(r[-4:])
    print(f"    answer from {s.getpeername()[0]} port {s.getpeername()[1]}: example.com A {ip}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"echo-server": echo_server, "tcp-client": tcp_client, "dns-query": dns_query}[cmd](*args)
