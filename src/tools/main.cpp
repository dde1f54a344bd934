#include <iostream>

int main() {
  std::cout << "pto\n";
  return 0;
}
