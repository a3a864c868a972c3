# The tenure image: the multi-call server binary (tenure replica|lease|promoter|
# health) and tenurectl, static (CGO off), FROM scratch. Nothing is pulled:
# `make images` builds the binaries and stages the context (bin/images/tenure).
# No "# syntax=" line: that would make the builder pull a frontend image.
FROM scratch
ENV PATH=/usr/local/bin
COPY tmp /tmp
COPY --chown=65532:65532 data /data
COPY tenure tenurectl /usr/local/bin/
USER 65532:65532
WORKDIR /data
CMD ["tenure", "--help"]
