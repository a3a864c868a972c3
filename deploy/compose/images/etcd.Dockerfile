# The etcd image: the real etcd server built static from its pinned module
# (deploy/tools/etcd), plus httpcheck for the health check, FROM scratch.
FROM scratch
ENV PATH=/usr/local/bin
COPY tmp /tmp
COPY --chown=65532:65532 data /data
COPY etcd httpcheck /usr/local/bin/
USER 65532:65532
WORKDIR /data
EXPOSE 2379 2380
ENV ETCD_DATA_DIR=/data/etcd
CMD ["etcd"]
