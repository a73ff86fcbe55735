// Anchor of the shared test library; fixtures live beside it.
namespace sluice::test {
int testlibAnchor = 0;
}
