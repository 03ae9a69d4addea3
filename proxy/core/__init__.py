"""kipside's proxy logic with no I/O: what is decided about a connection and a request, as plain
objects that take bytes and times in and give decisions out, tested in memory with a model
clock. It never imports trio, sockets or ssl (`make lint` checks it): the drivers in session/
and upstream/ move the bytes and the time.
"""
