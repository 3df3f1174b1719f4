# kvtierd and the kvtier tool in a Debian 12 image (docker-compose.yml runs a cluster of them).
#
#   docker build -t kvtier .
#   docker run --rm --shm-size 1.5g -v kvtier-data:/var/lib/kvtier kvtier    # one daemon, defaults
#
# Two stages: the build stage installs the project's build dependencies with its own script and
# builds only the two binaries (Release, no tests, no benchmarks, no CUDA); the run stage holds
# the binaries and the Debian packages of the shared libraries they load, nothing else.
#
# The host pool lives in /dev/shm (1 GiB by default: give the container a larger --shm-size /
# shm_size than Docker's 64 MiB). Clients on the same host reach the daemon through the Unix
# socket /run/kvtier/kvtierd.sock (share /run/kvtier as a volume); in another container they get
# their bytes inline, since they cannot map this container's /dev/shm.

FROM debian:12 AS build
# The dependency layer first, so that editing sources does not reinstall packages.
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN bash /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . /src
WORKDIR /src
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=OFF \
          -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF \
 && cmake --build /build -j "$(nproc)" --target kvtierd kvtier \
 && strip /build/daemon/kvtierd /build/tools/kvtier

FROM debian:12-slim AS run
# What `ldd kvtierd` and `ldd kvtier` resolve to, by Debian package (`dpkg -S`): UCX (its
# transport modules under /usr/lib/x86_64-linux-gnu/ucx come with libucx0), Cap'n Proto and KJ,
# RocksDB and its compression libraries, xxHash, OpenSSL's libcrypto, libnuma, and the C/C++
# runtime.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libucx0 libnuma1 \
      libcapnp-0.9.2 \
      librocksdb7.8 libgflags2.2 libsnappy1v5 zlib1g libbz2-1.0 liblz4-1 libzstd1 \
      libxxhash0 \
      libssl3 \
      libstdc++6 libgcc-s1 libc6 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/daemon/kvtierd /build/tools/kvtier /usr/local/bin/
# A fixed uid, so that clients in other containers (the compose file's demo) run as the same
# user: the daemon serves its socket to its own uid and gid (SO_PEERCRED).
RUN groupadd --system --gid 10001 kvtier \
 && useradd --system --uid 10001 --gid kvtier --home-dir /var/lib/kvtier --no-create-home \
            --shell /usr/sbin/nologin kvtier \
 && install -d -o kvtier -g kvtier -m 0750 /var/lib/kvtier \
 && install -d -o kvtier -g kvtier -m 0750 /run/kvtier
USER kvtier
WORKDIR /var/lib/kvtier
# The data dir: lock file, the cold tier (RocksDB), snapshots on disk, the node id.
VOLUME /var/lib/kvtier
ENV KVTIER_SOCKET=/run/kvtier/kvtierd.sock
# The peer listener (--listen 0.0.0.0:7000 in docker-compose.yml; off unless --listen is given).
EXPOSE 7000
# Flags after the image name are added to these (a later flag overrides an earlier one).
ENTRYPOINT ["kvtierd", "--data-dir", "/var/lib/kvtier", "--socket", "/run/kvtier/kvtierd.sock"]
